package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// BystanderStats is what a bystander measured over one phase.
type BystanderStats struct {
	Acks  int     `json:"acks"`
	P99ms float64 `json:"p99_ms"` // NaN when no ack came
	Lost  int     `json:"lost"`   // heartbeats not acked within 1 s
}

// Bystander is the connection whose heartbeat acks Abuse times. Mark
// returns what it measured since the previous Mark (or its start).
type Bystander interface {
	Mark() (BystanderStats, error)
}

// inlineBystander heartbeats from this process, where the floods run too:
// its figures include the load generator's own scheduling.
type inlineBystander struct {
	hist syncHist
	lost atomic.Int64
	stop func()
}

// startBystander dials the bystander and heartbeats every 100 ms until
// stop is called.
func (a *abuser) startBystander(ctx context.Context) (*inlineBystander, error) {
	ws, err := a.dialWS(ctx, "bystander")
	if err != nil {
		return nil, fmt.Errorf("loadgen: abuse: the bystander cannot connect: %w", err)
	}
	b := &inlineBystander{}
	bctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ws.heartbeat(bctx, 100*time.Millisecond, &b.hist, &b.lost) }()
	b.stop = func() { cancel(); ws.c.Close(); wg.Wait() }
	return b, nil
}

func (b *inlineBystander) Mark() (BystanderStats, error) {
	b.hist.mu.Lock()
	h := b.hist.h
	b.hist.h = Histogram{}
	b.hist.mu.Unlock()
	s := BystanderStats{Acks: int(h.N), P99ms: math.NaN(), Lost: int(b.lost.Swap(0))}
	if h.N > 0 {
		s.P99ms = float64(h.Quantile(0.99)) / float64(time.Millisecond)
	}
	return s, nil
}

// ServeBystander is the bystander in a process of its own: it connects to
// the node at nodeURL, heartbeats every 100 ms, and answers each line read
// from in with one JSON line of BystanderStats on out, for the time since
// the previous line. It returns when in ends or ctx does. Measured apart
// from the floods, its acks time the node, not the load generator's
// scheduler too.
func ServeBystander(ctx context.Context, nodeURL, jwtSecret string, in io.Reader, out io.Writer) error {
	u, err := url.Parse(nodeURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "ws") || u.Host == "" {
		return fmt.Errorf("loadgen: bystander: --url %q must be http://host:port", nodeURL)
	}
	a := &abuser{o: AbuseOptions{JWTSecret: jwtSecret}, addr: u.Host}
	b, err := a.startBystander(ctx)
	if err != nil {
		return err
	}
	defer b.stop()
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		s, _ := b.Mark()
		if math.IsNaN(s.P99ms) {
			s.P99ms = -1 // JSON has no NaN
		}
		if err := enc.Encode(s); err != nil {
			return err
		}
	}
	return sc.Err()
}

// DecodeBystanderStats reads one line of ServeBystander's output.
func DecodeBystanderStats(line []byte) (BystanderStats, error) {
	var s BystanderStats
	if err := json.Unmarshal(line, &s); err != nil {
		return s, fmt.Errorf("loadgen: bystander: %w: %q", err, line)
	}
	if s.P99ms < 0 {
		s.P99ms = math.NaN()
	}
	return s, nil
}
