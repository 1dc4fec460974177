// Package gctune lowers the garbage collector's headroom while the process
// allocates little, and restores it as soon as it allocates again.
//
// A node's heap is mostly long-lived connection state. The collector lets
// the heap grow by GOGC percent of what is live before it collects again, so
// at 50 a third of an idle node's heap is headroom, and the runtime keeps
// about that much resident. Collecting more often costs CPU in proportion
// to what is allocated, and an idle node allocates little: while it stays
// quiet the tuner collects at a small percent and returns the headroom to
// the system once; when allocations rise (a wave of connects) it goes back
// to the busy percent at the next sample, so busy work is collected as
// before.
package gctune

import (
	"context"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Config sets the two percents and what counts as quiet.
type Config struct {
	Busy  int // GOGC while allocating
	Quiet int // GOGC while quiet; below Busy
	// QuietRate is the allocation rate, as a fraction of the live heap per
	// second, at or below which the process counts as quiet: on average
	// over QuietAfter to enter; leaving takes more (see Step).
	QuietRate  float64
	QuietAfter time.Duration // at least exitWindow intervals
	Interval   time.Duration // between samples
}

// Defaults. An idle node allocates well under 1% of its live heap a second
// (acks, sweeps, scrapes); at GOGC 10 it then collects about every 25 s,
// and each collection marks the live heap once: 25-35 ms of CPU at 15,000
// connections (docs/benchmarks.md, "Dec 6, eighth"). A node connecting or
// churning allocates several times its live heap a second and stays at Busy.
var Defaults = Config{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 20 * time.Second, Interval: time.Second}

// Sample is what the tuner reads each interval.
type Sample struct {
	At     time.Time
	Allocs uint64 // bytes allocated since the process started
	Live   uint64 // bytes live after the last collection; 0 before the first
}

// Tuner decides, sample by sample; Start feeds it from the runtime.
type Tuner struct {
	cfg     Config
	setGC   func(int) int
	release func()
	window  int // samples averaged to enter quiet
	prev    int // GOGC before New

	last    Sample
	started bool
	recent  []float64 // allocation rates of the latest samples, as shares of the live heap per second, oldest first
	quiet   bool
}

// exitWindow is how many of the latest samples Step averages to leave
// quiet: one metrics scrape or API call allocates a burst that is no
// reason to.
const exitWindow = 5

// New returns a tuner that sets GOGC with setGC and returns memory to the
// system with release (debug.SetGCPercent and debug.FreeOSMemory; tests
// pass their own). It applies cfg.Busy at once.
func New(cfg Config, setGC func(int) int, release func()) (*Tuner, error) {
	switch {
	case cfg.Interval <= 0:
		return nil, fmt.Errorf("gctune: interval %v, want > 0", cfg.Interval)
	case cfg.QuietAfter < exitWindow*cfg.Interval:
		return nil, fmt.Errorf("gctune: quiet-after %v, want at least %d intervals", cfg.QuietAfter, exitWindow)
	case cfg.Quiet <= 0 || cfg.Quiet >= cfg.Busy:
		return nil, fmt.Errorf("gctune: quiet GOGC %d and busy %d, want 0 < quiet < busy", cfg.Quiet, cfg.Busy)
	case cfg.QuietRate <= 0:
		return nil, fmt.Errorf("gctune: quiet rate %v, want > 0", cfg.QuietRate)
	}
	n := int(cfg.QuietAfter / cfg.Interval)
	t := &Tuner{cfg: cfg, setGC: setGC, release: release, window: n, recent: make([]float64, 0, n)}
	t.prev = setGC(cfg.Busy)
	return t, nil
}

// Quiet reports whether the quiet percent is in force.
func (t *Tuner) Quiet() bool { return t.quiet }

// Step takes one sample. Rates are per second of the time between samples,
// so a late tick (a busy machine, the release itself) is not read as a
// burst. Quiet starts once the last QuietAfter of samples, and the last
// exitWindow of them, averaged at or below QuietRate; it ends when the last
// exitWindow average more than twice it (one second of a wave of connects,
// which allocates several times the live heap, is enough). After it ends, a
// whole new QuietAfter must pass: the quiet seconds before a burst do not
// count again, so one burst costs one exit, not an exit and a forced
// collection a second later. A sample no later than the one before, or
// taken before the first collection (no live heap), is a new base only.
func (t *Tuner) Step(s Sample) {
	prev := t.last
	t.last = s
	if !t.started {
		t.started = true
		return
	}
	secs := s.At.Sub(prev.At).Seconds()
	if secs <= 0 || s.Live == 0 {
		// No time passed, or no collection yet to say what is live: no
		// rate to judge by. Nothing changes.
		return
	}
	if len(t.recent) == cap(t.recent) {
		copy(t.recent, t.recent[1:])
		t.recent = t.recent[:len(t.recent)-1]
	}
	t.recent = append(t.recent, float64(s.Allocs-prev.Allocs)/float64(s.Live)/secs)
	line := t.cfg.QuietRate
	if t.quiet {
		if mean(t.recent, exitWindow) > 2*line {
			t.quiet = false
			t.recent = t.recent[:0]
			t.setGC(t.cfg.Busy)
		}
		return
	}
	// The latest seconds too: a wave that began at the end of a quiet
	// window would otherwise enter quiet and leave it at the next sample.
	if len(t.recent) == t.window && mean(t.recent, t.window) <= line && mean(t.recent, exitWindow) <= line {
		t.quiet = true
		t.setGC(t.cfg.Quiet)
		// The lower goal takes effect at the next collection, and the
		// scavenger would return the freed pages slowly: do both now, once.
		t.release()
	}
}

// mean is the average of the last n of xs (all of them if fewer).
func mean(xs []float64, n int) float64 {
	n = max(min(n, len(xs)), 1)
	var sum float64
	for _, x := range xs[len(xs)-n:] {
		sum += x
	}
	return sum / float64(n)
}

// Start applies cfg.Busy now and tunes the runtime's GOGC in a goroutine
// until stop is called. stop waits for the goroutine and puts back the
// GOGC in force before Start.
func Start(cfg Config) (stop func(), err error) {
	t, err := New(cfg, debug.SetGCPercent, debug.FreeOSMemory)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.run(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done // a Step in flight sets GOGC no more
			debug.SetGCPercent(t.prev)
		})
	}, nil
}

// run samples the runtime every cfg.Interval until ctx ends.
func (t *Tuner) run(ctx context.Context) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		metrics.Read(samples)
		t.Step(Sample{At: time.Now(), Allocs: samples[0].Value.Uint64(), Live: samples[1].Value.Uint64()})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
