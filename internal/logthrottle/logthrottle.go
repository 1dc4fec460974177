// Package logthrottle is a slog.Handler that lets a repeated log line
// through once per interval: under a sustained fault (Redis gone, a sweep
// failing ten times a second) the log gets the first line at once, then one
// line per interval saying how many like it were held back, instead of a
// line per failure.
//
// Lines are alike when they have the same level and message; the attributes
// (an error's text, an address) may differ, and the summary line carries
// those of the last line held back. It keeps no goroutine: a summary is
// written when its interval has passed and any line comes through, and by
// Flush, which the owner calls before exiting.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// maxKeys bounds the lines tracked at once; past it, new kinds pass
// unthrottled (a log with that many distinct messages is not a loop).
const maxKeys = 256

// Handler throttles the records it passes to the handler it wraps.
type Handler struct {
	next     slog.Handler
	interval time.Duration
	st       *state // shared by the handlers WithAttrs and WithGroup derive
}

type state struct {
	mu   sync.Mutex
	now  func() time.Time
	keys map[key]*window
}

type key struct {
	level slog.Level
	msg   string
}

// window is one kind of line within its interval.
type window struct {
	start time.Time
	held  int          // lines held back since start
	last  slog.Record  // the last one held back, for the summary
	h     slog.Handler // the handler that held it (its attrs and group)
}

// New wraps next; interval <= 0 passes every record through.
func New(next slog.Handler, interval time.Duration) *Handler {
	return &Handler{next: next, interval: interval, st: &state{now: time.Now, keys: make(map[key]*window)}}
}

// SetClock replaces time.Now, for tests.
func (h *Handler) SetClock(now func() time.Time) { h.st.now = now }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), interval: h.interval, st: h.st}
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), interval: h.interval, st: h.st}
}

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if h.interval <= 0 {
		return h.next.Handle(ctx, r)
	}
	now := h.st.now()
	k := key{r.Level, r.Message}
	h.st.mu.Lock()
	due := h.dueLocked(now)
	w := h.st.keys[k]
	pass := false
	switch {
	case w == nil:
		if len(h.st.keys) < maxKeys {
			h.st.keys[k] = &window{start: now}
		}
		pass = true
	default:
		w.held++
		w.last, w.h = r.Clone(), h.next
	}
	h.st.mu.Unlock()
	for _, s := range due {
		_ = s.h.Handle(ctx, s.r)
	}
	if pass {
		return h.next.Handle(ctx, r)
	}
	return nil
}

type summary struct {
	h slog.Handler
	r slog.Record
}

// dueLocked ends the windows whose interval has passed: each that held lines
// back becomes a summary and starts a new window (the fault may go on); one
// that held nothing is forgotten, so the next such line passes at once.
func (h *Handler) dueLocked(now time.Time) []summary {
	var out []summary
	for k, w := range h.st.keys {
		if now.Sub(w.start) < h.interval {
			continue
		}
		if w.held == 0 {
			delete(h.st.keys, k)
			continue
		}
		out = append(out, h.summaryOf(w, now))
		h.st.keys[k] = &window{start: now}
	}
	return out
}

func (h *Handler) summaryOf(w *window, now time.Time) summary {
	r := slog.NewRecord(now, w.last.Level, w.last.Message, w.last.PC)
	w.last.Attrs(func(a slog.Attr) bool { r.AddAttrs(a); return true })
	r.AddAttrs(slog.Int("repeated", w.held), slog.Duration("within", now.Sub(w.start).Round(time.Millisecond)))
	return summary{h: w.h, r: r}
}

// Flush writes the summaries of every line held back, at once. Call it
// before the process exits.
func (h *Handler) Flush() {
	now := h.st.now()
	h.st.mu.Lock()
	var out []summary
	for k, w := range h.st.keys {
		if w.held > 0 {
			out = append(out, h.summaryOf(w, now))
		}
		delete(h.st.keys, k)
	}
	h.st.mu.Unlock()
	for _, s := range out {
		_ = s.h.Handle(context.Background(), s.r)
	}
}

var _ slog.Handler = (*Handler)(nil)
