package gctune

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
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

func (r *recorder) set(p int) int { r.gogc = append(r.gogc, p); return 100 }
func (r *recorder) release()      { r.releases++ }
func (r *recorder) now() int      { return r.gogc[len(r.gogc)-1] }

// testCfg: QuietAfter is 8 samples, apart from exitWindow's 5, so a mix-up
// of the two shows.
var testCfg = Config{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 8 * time.Second, Interval: time.Second}

// clock feeds a tuner samples a second apart with a live heap of 1,000
// bytes: the quiet line is then 50 bytes a second.
type clock struct {
	tu     *Tuner
	at     time.Time
	allocs uint64
}

func newClock(t *testing.T) (*clock, *recorder) {
	t.Helper()
	return newClockAfter(t, testCfg.QuietAfter)
}

// newClockAfter is newClock with another QuietAfter.
func newClockAfter(t *testing.T, quietAfter time.Duration) (*clock, *recorder) {
	t.Helper()
	r := &recorder{}
	cfg := testCfg
	cfg.QuietAfter = quietAfter
	tu, err := New(cfg, r.set, r.release)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{tu: tu, at: time.Unix(1000, 0)}
	c.tu.Step(Sample{At: c.at, Live: 1000}) // the first sample only sets the base
	return c, r
}

// feed steps the tuner once per given allocation, a second apart.
func (c *clock) feed(per ...uint64) {
	for _, n := range per {
		c.after(time.Second, n, 1000)
	}
}

func (c *clock) after(d time.Duration, allocated, live uint64) {
	c.at = c.at.Add(d)
	c.allocs += allocated
	c.tu.Step(Sample{At: c.at, Allocs: c.allocs, Live: live})
}

func zeros(n int) []uint64 { return make([]uint64, n) }

func TestQuietOnlyAfterQuietAfter(t *testing.T) {
	c, r := newClock(t)
	if r.now() != 50 {
		t.Fatalf("GOGC %d at the start, want Busy", r.now())
	}
	c.feed(40, 50, 0, 10, 20, 0, 30) // seven quiet seconds: at or below the line
	if c.tu.Quiet() || r.now() != 50 || r.releases != 0 {
		t.Fatalf("quiet after 7 s of 8: GOGC %d, releases %d", r.now(), r.releases)
	}
	c.feed(20)
	if !c.tu.Quiet() || r.now() != 10 || r.releases != 1 {
		t.Fatalf("after 8 quiet seconds: quiet %v, GOGC %d, releases %d", c.tu.Quiet(), r.now(), r.releases)
	}
	c.feed(zeros(20)...)
	if r.releases != 1 || len(r.gogc) != 2 {
		t.Fatalf("staying quiet set GOGC %v and released %d times, want once each", r.gogc, r.releases)
	}
}

// Entering goes by the average over QuietAfter: a burst (a metrics
// scrape) among quiet seconds does not hold a node at Busy, a busy spell
// does until it is averaged out.
func TestQuietGoesByTheAverage(t *testing.T) {
	c, _ := newClock(t)
	c.feed(10, 10, 10, 180, 10, 10, 10, 10) // mean 31
	if !c.tu.Quiet() {
		t.Fatal("one burst among quiet seconds kept the node busy")
	}

	c, _ = newClock(t)
	c.feed(60, 60, 60, 60, 60, 60, 60, 60, 60) // just over the line
	if c.tu.Quiet() {
		t.Fatal("quiet at 60, over the line of 50")
	}
	c.feed(10) // mean (7×60+10)/8 = 54
	if c.tu.Quiet() {
		t.Fatal("quiet while the last 8 s averaged 54")
	}
	c.feed(10) // (6×60+20)/8 = 47.5
	if !c.tu.Quiet() {
		t.Fatal("not quiet once the last 8 s averaged under the line")
	}
}

func quietClock(t *testing.T) (*clock, *recorder) {
	t.Helper()
	c, r := newClock(t)
	c.feed(zeros(8)...)
	if !c.tu.Quiet() {
		t.Fatal("not quiet after 8 idle seconds")
	}
	return c, r
}

func TestBusyOnAWaveOrASpellNotOnABurst(t *testing.T) {
	// A burst of eight lines in one second averages 1.6 lines over the
	// last five: no reason to leave.
	c, r := quietClock(t)
	c.feed(400, 0, 0)
	if !c.tu.Quiet() || r.now() != 10 {
		t.Fatalf("left quiet for one burst: GOGC %v", r.gogc)
	}
	// More than ten lines in one second puts the last five over twice the
	// line: a wave of connects, at once. Ten exactly does not.
	c, r = quietClock(t)
	c.feed(500)
	if !c.tu.Quiet() {
		t.Fatal("left quiet at exactly twice the line over the last five")
	}
	c, r = quietClock(t)
	c.feed(501)
	if c.tu.Quiet() || r.now() != 50 {
		t.Fatalf("still quiet in a wave: GOGC %v", r.gogc)
	}
	// A spell over twice the line, once it fills the exit window.
	c, r = quietClock(t)
	c.feed(110, 110, 110, 110)
	if !c.tu.Quiet() {
		t.Fatal("left quiet before the spell filled 5 s")
	}
	c.feed(110)
	if c.tu.Quiet() || r.now() != 50 {
		t.Fatalf("still quiet after 5 s at twice the line: GOGC %v", r.gogc)
	}
}

// The quiet seconds before an exit do not count again: a burst costs one
// exit, not an exit and a forced collection a second later, and so on at
// every burst. With QuietAfter of 20 s, a wave of 501 among 20 quiet
// seconds would otherwise average 25, under the line.
func TestOneBurstCostsOneExit(t *testing.T) {
	c, r := newClockAfter(t, 20*time.Second)
	c.feed(zeros(20)...)
	if !c.tu.Quiet() {
		t.Fatal("not quiet after 20 idle seconds")
	}
	c.feed(501)
	if c.tu.Quiet() {
		t.Fatal("still quiet in a wave")
	}
	c.feed(zeros(19)...)
	if c.tu.Quiet() || r.releases != 1 {
		t.Fatalf("quiet again %v after 19 s, releases %d: the seconds before the exit counted", c.tu.Quiet(), r.releases)
	}
	c.feed(0)
	if !c.tu.Quiet() || r.releases != 2 {
		t.Fatalf("not quiet 20 s after the exit: quiet %v, releases %d", c.tu.Quiet(), r.releases)
	}
}

// At the line counts as quiet.
func TestAtTheLineIsQuiet(t *testing.T) {
	c, _ := newClock(t)
	c.feed(50, 50, 50, 50, 50, 50, 50, 50)
	if !c.tu.Quiet() {
		t.Fatal("8 s at exactly the line did not count as quiet")
	}
}

// A wave that begins at the end of a quiet window is no reason to enter
// quiet (and leave it, with a forced collection, at the next sample).
func TestAWaveAtTheEndOfAQuietWindowIsNoEntry(t *testing.T) {
	for _, tc := range []struct {
		name string
		per  []uint64
	}{
		{"19 idle seconds, then twenty lines", append(zeros(19), 1000)},                   // 20 s mean: 50
		{"16 idle seconds, then 4 at three lines", append(zeros(16), 150, 150, 150, 150)}, // 30
	} {
		c, r := newClockAfter(t, 20*time.Second)
		c.feed(tc.per...)
		if c.tu.Quiet() || r.releases != 0 {
			t.Errorf("%s: quiet %v, releases %d", tc.name, c.tu.Quiet(), r.releases)
		}
	}
}

// A sample no later than the one before, or without a live heap, gives no
// rate: it neither ends quiet nor counts toward it.
func TestASampleWithoutTimeOrLiveHeapJudgesNothing(t *testing.T) {
	c, r := quietClock(t)
	c.after(0, 1_000_000, 1000)
	c.after(-time.Second, 1_000_000, 1000)
	c.after(time.Second, 1_000_000, 0)
	if !c.tu.Quiet() || r.now() != 10 {
		t.Fatalf("left quiet on a sample without a rate: GOGC %v", r.gogc)
	}
	c.feed(10)
	if !c.tu.Quiet() {
		t.Fatal("left quiet on a quiet second after them")
	}
}

// Rates are per second of the time between samples: a tick that comes
// late (a busy machine) is not a burst.
func TestALateTickIsNoBurst(t *testing.T) {
	c, r := quietClock(t)
	c.after(12*time.Second, 12*45, 1000) // 540 bytes, 45 a second
	if !c.tu.Quiet() || r.now() != 10 {
		t.Fatalf("a late tick read as a wave: GOGC %v", r.gogc)
	}
}

// The line follows the live heap: the same allocation is busy for a small
// heap and quiet for a large one. Before the first collection there is no
// live heap to judge by, and nothing changes.
func TestTheLineIsAShareOfTheLiveHeap(t *testing.T) {
	c, _ := newClock(t)
	for range 10 {
		c.after(time.Second, 1000, 10_000) // 10% a second
	}
	if c.tu.Quiet() {
		t.Fatal("10% of the live heap a second counted as quiet")
	}
	for range 8 {
		c.after(time.Second, 1000, 100_000) // 1% a second
	}
	if !c.tu.Quiet() {
		t.Fatal("1% of the live heap a second did not count as quiet")
	}

	c, r := newClock(t)
	for range 20 {
		c.after(time.Second, 0, 0)
	}
	if c.tu.Quiet() || len(r.gogc) != 1 {
		t.Fatalf("without a live heap: quiet %v, GOGC %v", c.tu.Quiet(), r.gogc)
	}
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	r := &recorder{}
	if _, err := New(Defaults, r.set, r.release); err != nil {
		t.Fatalf("Defaults: %v", err)
	}
	for _, cfg := range []Config{
		{},
		{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 20 * time.Second},                        // no interval
		{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 4 * time.Second, Interval: time.Second},  // shorter than the exit window
		{Busy: 50, Quiet: 50, QuietRate: 0.05, QuietAfter: 20 * time.Second, Interval: time.Second}, // quiet not below busy
		{Busy: 50, Quiet: 10, QuietRate: 0, QuietAfter: 20 * time.Second, Interval: time.Second},    // no rate
	} {
		if _, err := New(cfg, r.set, r.release); err == nil || !strings.HasPrefix(err.Error(), "gctune: ") {
			t.Errorf("%+v: err %v, want a gctune: error", cfg, err)
		}
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Start reads the runtime's own figures and sets its GOGC; stop ends the
// goroutine (goleak checks) and puts back what was in force.
func TestStartTunesTheRuntimeAndStopRestores(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	runtime.GC() // a live heap to judge by
	// Any rate below a thousand live heaps a second is quiet: this test
	// process is, whatever else runs in it.
	stop, err := Start(Config{Busy: 70, Quiet: 15, QuietRate: 1000, QuietAfter: 50 * time.Millisecond, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if p := gogc(); p != 15 {
			return fmt.Errorf("GOGC %d, want the quiet 15", p)
		}
		return nil
	})
	stop()
	if p := gogc(); p != 100 {
		t.Fatalf("GOGC %d after stop, want the 100 before Start", p)
	}
	debug.SetGCPercent(90)
	stop() // twice: nothing more
	if p := gogc(); p != 90 {
		t.Fatalf("a second stop set GOGC %d", p)
	}
}
