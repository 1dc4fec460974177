package e2e

import (
	"net"
	"sync"
	"testing"
	"time"
)

// faultProxy forwards TCP connections from its own 127.0.0.1 port to an
// upstream address and can hold or delay the traffic the way a network does
// to TCP: a partition holds every byte (nothing flows, connects are accepted
// but nothing answers) and delivers it, in order, when it heals, unless an
// endpoint gave up and closed first; latency delays each chunk. Nothing is
// ever dropped or reordered, so a stream that survives a fault is intact.
//
// (toxiproxy's "timeout" toxic, the usual way to fake a partition, drops the
// bytes it holds and lets the stream resume with a gap: Redis replies would
// then be read as the answers to other commands, which no network does.)
type faultProxy struct {
	t  testing.TB
	ln net.Listener

	mu       sync.Mutex
	upstream string
	latency  time.Duration
	held     chan struct{} // closed while traffic flows; open during a partition
	pipes    map[net.Conn]struct{}
	closed   bool

	wg sync.WaitGroup
}

func newFaultProxy(t testing.TB) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, ln: ln, held: make(chan struct{}), pipes: map[net.Conn]struct{}{}}
	close(p.held)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *faultProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *faultProxy) SetUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// SetLatency delays every chunk by d from now on (0: none).
func (p *faultProxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Partition holds all traffic until Heal.
func (p *faultProxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
		p.held = make(chan struct{})
	default:
	}
}

// Heal lets held traffic through, in order.
func (p *faultProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
	default:
		close(p.held)
	}
}

func (p *faultProxy) gate() (<-chan struct{}, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.latency
}

// Close stops accepting, ends every connection and waits for its goroutines.
func (p *faultProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.pipes {
		_ = c.Close()
	}
	select {
	case <-p.held:
	default:
		close(p.held)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.pipes[c] = struct{}{}
	return true
}

func (p *faultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.pipes, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			continue
		}
		p.wg.Add(1)
		go p.serve(down)
	}
}

// serve connects one accepted connection upstream, once the network lets it.
func (p *faultProxy) serve(down net.Conn) {
	defer p.wg.Done()
	held, _ := p.gate()
	<-held
	p.mu.Lock()
	upstream := p.upstream
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", upstream, 2*time.Second)
	if err != nil {
		p.untrack(down) // refused, like the Redis port itself
		return
	}
	if !p.track(up) {
		p.untrack(down)
		return
	}
	p.wg.Add(2)
	go p.pump(down, up)
	go p.pump(up, down)
}

type chunk struct {
	data []byte
	at   time.Time
}

// pump copies src to dst through the gate. When src ends, what was read is
// still delivered, then dst is closed; the other direction follows.
func (p *faultProxy) pump(src, dst net.Conn) {
	defer p.wg.Done()
	ch := make(chan chunk, 64)
	done := make(chan struct{})
	go func() { // owned by pump: it waits for done
		defer close(done)
		for c := range ch {
			for {
				held, latency := p.gate()
				select {
				case <-held:
				default:
					<-held // partitioned: wait for the heal
					continue
				}
				if wait := time.Until(c.at.Add(latency)); wait > 0 {
					time.Sleep(min(wait, 50*time.Millisecond))
					continue // the latency or the partition may have changed
				}
				break
			}
			if _, err := dst.Write(c.data); err != nil {
				p.untrack(dst)
				p.untrack(src)
				for range ch {
				}
				return
			}
		}
		p.untrack(dst)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{data: append([]byte(nil), buf[:n]...), at: time.Now()}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
	p.untrack(src)
}
