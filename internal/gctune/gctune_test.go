package gctune

import (
	"context"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/greendot/greendot/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder stands in for the runtime: what the tuner set, and how often it
// returned memory.
type recorder struct {
	gogc     []int
	releases int
}

func (r *recorder) set(p int) int { r.gogc = append(r.gogc, p); return 0 }
func (r *recorder) release()      { r.releases++ }
func (r *recorder) now() int      { return r.gogc[len(r.gogc)-1] }

var testCfg = Config{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 5 * time.Second, Interval: time.Second}

// feed steps t with a live heap of 1,000 bytes and each given allocation
// per interval (the quiet line is then 50 bytes).
func feed(t *Tuner, allocs *uint64, per ...uint64) {
	for _, n := range per {
		*allocs += n
		t.Step(Sample{Allocs: *allocs, Live: 1000})
	}
}

func TestQuietOnlyAfterQuietAfter(t *testing.T) {
	r := &recorder{}
	tu := New(testCfg, r.set, r.release)
	if r.now() != 50 {
		t.Fatalf("GOGC %d at the start, want Busy", r.now())
	}
	var allocs uint64
	feed(tu, &allocs, 0)             // the first sample only sets the base
	feed(tu, &allocs, 40, 50, 0, 10) // four quiet seconds: at or below the line
	if tu.Quiet() || r.now() != 50 || r.releases != 0 {
		t.Fatalf("quiet after 4 s of 5: GOGC %d, releases %d", r.now(), r.releases)
	}
	feed(tu, &allocs, 20)
	if !tu.Quiet() || r.now() != 10 || r.releases != 1 {
		t.Fatalf("after 5 quiet seconds: quiet %v, GOGC %d, releases %d", tu.Quiet(), r.now(), r.releases)
	}
	feed(tu, &allocs, 0, 0, 0, 0, 0, 0)
	if r.releases != 1 || len(r.gogc) != 2 {
		t.Fatalf("staying quiet set GOGC %v and released %d times, want once each", r.gogc, r.releases)
	}
}

// Entering goes by the average over QuietAfter: a burst (a metrics
// scrape) among quiet seconds does not hold a node at Busy, a busy spell
// does.
func TestQuietGoesByTheAverage(t *testing.T) {
	r := &recorder{}
	tu := New(testCfg, r.set, r.release)
	var allocs uint64
	feed(tu, &allocs, 0, 10, 10, 180, 10, 10) // mean 44 over the last 5
	if !tu.Quiet() {
		t.Fatal("one burst among quiet seconds kept the node busy")
	}

	r = &recorder{}
	tu = New(testCfg, r.set, r.release)
	allocs = 0
	feed(tu, &allocs, 0, 60, 60, 60, 60, 60, 60, 60) // just over the line
	if tu.Quiet() {
		t.Fatal("quiet at 60, over the line of 50")
	}
	feed(tu, &allocs, 10, 10, 10, 10) // mean (60+40)/5 = 20
	if !tu.Quiet() {
		t.Fatal("not quiet once the last 5 s averaged under the line")
	}
}

func TestBusyOnAWaveOrASpellNotOnABurst(t *testing.T) {
	quietTuner := func() (*Tuner, *recorder, *uint64) {
		r := &recorder{}
		tu := New(testCfg, r.set, r.release)
		var allocs uint64
		feed(tu, &allocs, 0, 0, 0, 0, 0, 0)
		if !tu.Quiet() {
			t.Fatal("not quiet")
		}
		return tu, r, &allocs
	}
	// A burst of eight lines in one second averages 1.6 lines over the
	// last five: no reason to leave.
	tu, r, allocs := quietTuner()
	feed(tu, allocs, 400, 0, 0)
	if !tu.Quiet() || r.now() != 10 {
		t.Fatalf("left quiet for one burst: GOGC %v", r.gogc)
	}
	// More than ten lines in one second: a wave of connects, at once.
	tu, r, allocs = quietTuner()
	feed(tu, allocs, 501)
	if tu.Quiet() || r.now() != 50 {
		t.Fatalf("still quiet in a wave: GOGC %v", r.gogc)
	}
	// A spell over twice the line, once it fills the exit window.
	tu, r, allocs = quietTuner()
	feed(tu, allocs, 110, 110, 110, 110)
	if !tu.Quiet() {
		t.Fatal("left quiet before the spell filled 5 s")
	}
	feed(tu, allocs, 110)
	if tu.Quiet() || r.now() != 50 {
		t.Fatalf("still quiet after 5 s at twice the line: GOGC %v", r.gogc)
	}
	// Quiet again once the average is back under the line (44 after a
	// third quiet second), and it releases again.
	feed(tu, allocs, 0, 0)
	if tu.Quiet() {
		t.Fatal("quiet again while the last 5 s averaged 66, over the line")
	}
	feed(tu, allocs, 0)
	if !tu.Quiet() || r.releases != 2 {
		t.Fatalf("quiet %v, releases %d", tu.Quiet(), r.releases)
	}
}

// The line follows the live heap: the same allocation is busy for a small
// heap and quiet for a large one.
func TestTheLineIsAShareOfTheLiveHeap(t *testing.T) {
	r := &recorder{}
	tu := New(testCfg, r.set, r.release)
	var allocs uint64
	for range 10 {
		allocs += 1000
		tu.Step(Sample{Allocs: allocs, Live: 10_000}) // 10% a second
	}
	if tu.Quiet() {
		t.Fatal("10% of the live heap a second counted as quiet")
	}
	for range 6 {
		allocs += 1000
		tu.Step(Sample{Allocs: allocs, Live: 100_000}) // 1% a second
	}
	if !tu.Quiet() {
		t.Fatal("1% of the live heap a second did not count as quiet")
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Run reads the runtime's own figures and sets its GOGC, and returns when
// its context ends.
func TestRunSetsTheRuntimesGOGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// Any rate below a thousand live heaps a second is quiet: this test
	// process is, whatever else runs in it.
	cfg := Config{Busy: 70, Quiet: 15, QuietRate: 1000, QuietAfter: 50 * time.Millisecond, Interval: 10 * time.Millisecond}
	go func() {
		defer close(done)
		Run(ctx, cfg)
	}()
	testwait.For(t, 10*time.Second, func() error {
		if p := gogc(); p != 15 {
			return fmt.Errorf("GOGC %d, want the quiet 15", p)
		}
		return nil
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
