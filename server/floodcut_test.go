package server_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// A ping flood read in one go is cut on the poller: of 1,000 pings written
// at once only the 120 before the run's last are handled (40 pongs, one
// rate_limited, 80 dropped silently), then 1008. Without the cut all 1,000
// were parsed and run through the rate limit, each costing the shared
// poller and workers what another connection's frames waited for.
func TestPingFloodIsCutOnThePoller(t *testing.T) {
	ts := startServer(t, frozen) // no refill: the burst of 40 is all there is
	w := dialRawWS(t, ts, "alice")
	var flood []byte
	for range 1000 {
		flood = append(flood, rawFrame(0x89, []byte("abcdefgh"), false)...)
	}
	if _, err := w.c.Write(flood); err != nil {
		t.Fatal(err)
	}
	pongs, limited := 0, 0
	for {
		op, p := w.read(t)
		if op == 0xa {
			pongs++
			continue
		}
		if op == 1 && strings.Contains(string(p), `"rate_limited"`) {
			limited++
			continue
		}
		if op == 8 {
			if len(p) < 2 || binary.BigEndian.Uint16(p) != 1008 || !bytes.Contains(p, []byte("rate limit exceeded")) {
				t.Fatalf("close %q, want 1008 rate limit exceeded", p)
			}
			break
		}
	}
	if pongs != 40 || limited != 1 {
		t.Fatalf("%d pongs and %d rate_limited errors, want 40 and 1", pongs, limited)
	}
	// The close ran after every frame handed on: the count is final.
	if !metricLine(t, ts, `greendot_frames_rejected_total{reason="rate_limited"} 81`) {
		_, body := ts.do("GET", "/metrics", "")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, `greendot_frames_rejected_total{reason="rate_limited"}`) {
				t.Fatalf("%s, want 81: frames past the flood's cut were handled", l)
			}
		}
		t.Fatal("no rate_limited count")
	}
}

// A connection in a run of refused frames decodes its big frames on at most
// half the cores: while those are busy, its big query is refused undecoded
// (no query_result though the bucket could pay for it) and continues the
// run, and another connection's heartbeat is answered meanwhile.
func TestFloodingQueriesAreRefusedWhileTheirLaneIsBusy(t *testing.T) {
	ts := startServer(t, frozen) // no refill: the burst of 40 is all there is
	flood := ts.dialSilent(t, "mallory")
	by := ts.dialSilent(t, "alice")
	long := func(n int) map[string]any { // ids long enough for a frame over 4 KiB
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("user-%095d", i)
		}
		return map[string]any{"type": "query", "id": "q", "user_ids": ids}
	}
	flood.send(long(500)) // 50 tokens: refused, the run's first
	flood.expectError("rate_limited")
	release := ts.srv.HoldBigFrames()
	flood.send(long(45)) // 5 tokens, affordable, but in a run and the lane is busy
	flood.send(`{"type":"heartbeat","id":"after"}`)
	if ack := flood.next("heartbeat_ack"); ack["id"] != "after" {
		t.Fatalf("flood: %v, want the ack with no query_result before it", ack)
	}
	by.send(`{"type":"heartbeat","id":"by"}`)
	if ack := by.next("heartbeat_ack"); ack["id"] != "by" {
		t.Fatalf("bystander ack = %v", ack)
	}
	if !metricLine(t, ts, `greendot_frames_rejected_total{reason="rate_limited"} 2`) {
		_, body := ts.do("GET", "/metrics", "")
		t.Fatalf("want 2 refused (the 500-id query, the 45-id one):\n%s", grepLines(body, "rate_limited"))
	}
	release()
	// The heartbeat ended the run: the same query is answered now.
	flood.send(long(45))
	if r := flood.next("query_result"); len(r["users"].([]any)) != 45 {
		t.Fatalf("query_result = %v", r)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
