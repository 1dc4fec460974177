package server_test

import (
	"bytes"
	"encoding/binary"
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
