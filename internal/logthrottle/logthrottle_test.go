package logthrottle

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRepeatedLinesAreSummarisedOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}), 10*time.Second)
	now := time.Unix(1000, 0)
	h.SetClock(func() time.Time { return now })
	log := slog.New(h).With("component", "test")

	// 88 failures in 12 s, one every 136 ms, and one other line.
	for i := range 88 {
		log.Warn("sweep failed", "err", "connection refused", "i", i)
		if i == 3 {
			log.Info("something else")
		}
		now = now.Add(136 * time.Millisecond)
	}
	h.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN msg="sweep failed" component=test err="connection refused" i=0`,
		`level=INFO msg="something else" component=test`,
		// Failure i=74 (at 10.064 s) ends the first window, which held
		// i=1…73; it is held in the next, which Flush ends.
		`level=WARN msg="sweep failed" component=test err="connection refused" i=73 repeated=73 within=10.064s`,
		`level=WARN msg="sweep failed" component=test err="connection refused" i=87 repeated=14 within=1.904s`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	total := 0
	for _, l := range lines {
		if !strings.Contains(l, "sweep failed") {
			continue
		}
		total++
		if _, n, ok := strings.Cut(l, "repeated="); ok {
			var k int
			for _, c := range n {
				if c < '0' || c > '9' {
					break
				}
				k = k*10 + int(c-'0')
			}
			total += k - 1
		}
	}
	if total != 88 {
		t.Errorf("lines and counts account for %d failures, want 88", total)
	}

	// Quiet for an interval: the next one passes at once.
	buf.Reset()
	now = now.Add(time.Minute)
	log.Warn("sweep failed", "err", "again")
	if got := strings.TrimSpace(buf.String()); got != `level=WARN msg="sweep failed" component=test err=again` {
		t.Errorf("after a quiet interval: %q", got)
	}
}

func TestZeroIntervalPassesEverything(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil), 0))
	for range 5 {
		log.Warn("x")
	}
	if n := strings.Count(buf.String(), "\n"); n != 5 {
		t.Fatalf("%d lines, want 5", n)
	}
}
