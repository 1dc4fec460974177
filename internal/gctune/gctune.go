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
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Config sets the two percents and what counts as quiet.
type Config struct {
	Busy  int // GOGC while allocating
	Quiet int // GOGC while quiet
	// QuietRate is the allocation rate, as a fraction of the live heap per
	// second, at or below which the process counts as quiet: on average
	// over QuietAfter to enter, and leaving takes more (see Step).
	QuietRate  float64
	QuietAfter time.Duration
	Interval   time.Duration // between samples
}

// Defaults. An idle node allocates ~1-3% of its live heap a second
// (heartbeats, acks, sweeps); at GOGC 10 it then collects every few
// seconds, and each collection marks the live heap once: ~35 ms of CPU at
// 15,000 connections (docs/benchmarks.md). A node connecting or churning
// allocates several times its live heap a second and stays at Busy.
var Defaults = Config{Busy: 50, Quiet: 10, QuietRate: 0.05, QuietAfter: 20 * time.Second, Interval: time.Second}

// Sample is what the tuner reads each interval.
type Sample struct {
	Allocs uint64 // bytes allocated since the process started
	Live   uint64 // bytes live after the last collection
}

// Tuner decides, sample by sample; Run feeds it from the runtime.
type Tuner struct {
	cfg     Config
	setGC   func(int) int
	release func()

	last    Sample
	started bool
	recent  []uint64 // bytes allocated in each of the last intervals, oldest first
	quiet   bool
}

// exitWindow is how many of the latest intervals Step averages to leave
// quiet: one metrics scrape or API call allocates a burst that is no
// reason to.
const exitWindow = 5

// New returns a tuner that sets GOGC with setGC and returns memory to the
// system with release (debug.SetGCPercent and debug.FreeOSMemory; tests
// pass their own). It applies cfg.Busy at once.
func New(cfg Config, setGC func(int) int, release func()) *Tuner {
	n := max(int(cfg.QuietAfter/cfg.Interval), exitWindow, 1)
	t := &Tuner{cfg: cfg, setGC: setGC, release: release, recent: make([]uint64, 0, n)}
	setGC(cfg.Busy)
	return t
}

// Quiet reports whether the quiet percent is in force.
func (t *Tuner) Quiet() bool { return t.quiet }

// Step takes one sample, cfg.Interval after the previous one. Quiet starts
// once the average of the last QuietAfter is at or below the line (the
// QuietRate of the live heap); it ends when the last exitWindow intervals
// average more than twice the line, or the last alone more than ten
// times it (a wave of connects).
func (t *Tuner) Step(s Sample) {
	prev := t.last
	t.last = s
	if !t.started {
		t.started = true
		return
	}
	if len(t.recent) == cap(t.recent) {
		copy(t.recent, t.recent[1:])
		t.recent = t.recent[:len(t.recent)-1]
	}
	t.recent = append(t.recent, s.Allocs-prev.Allocs)
	line := t.cfg.QuietRate * float64(s.Live) * t.cfg.Interval.Seconds()
	if t.quiet {
		if float64(t.recent[len(t.recent)-1]) > 10*line || mean(t.recent, exitWindow) > 2*line {
			t.quiet = false
			t.setGC(t.cfg.Busy)
		}
		return
	}
	n := int(t.cfg.QuietAfter / t.cfg.Interval)
	if len(t.recent) >= n && mean(t.recent, n) <= line {
		t.quiet = true
		t.setGC(t.cfg.Quiet)
		// The lower goal takes effect at the next collection, and the
		// scavenger would return the freed pages slowly: do both now, once.
		t.release()
	}
}

// mean is the average of the last n of xs (all of them if fewer).
func mean(xs []uint64, n int) float64 {
	n = max(min(n, len(xs)), 1)
	var sum float64
	for _, x := range xs[len(xs)-n:] {
		sum += float64(x)
	}
	return sum / float64(n)
}

// Run samples the runtime every cfg.Interval until ctx ends.
func Run(ctx context.Context, cfg Config) {
	t := New(cfg, debug.SetGCPercent, debug.FreeOSMemory)
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		metrics.Read(samples)
		t.Step(Sample{Allocs: samples[0].Value.Uint64(), Live: samples[1].Value.Uint64()})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
