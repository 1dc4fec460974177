package redisstore

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// replyProxy is a TCP proxy to Redis that can hold Redis's replies: the
// commands reach Redis and run, and their answers wait until released. A
// client that gives up meanwhile closes its connection, and the held reply
// is lost with it, as when a network fault outlasts a call's deadline.
type replyProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	held    chan struct{} // non-nil while replies are held; closed on release
	conns   map[net.Conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

func newReplyProxy(t *testing.T, upstream string) *replyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyProxy{ln: ln, upstream: upstream, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *replyProxy) url() string { return "redis://" + p.ln.Addr().String() }

// hold holds every reply from now until release.
func (p *replyProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

func (p *replyProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// gate is what a reply waits on: nil while replies flow.
func (p *replyProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

func (p *replyProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *replyProxy) close() {
	p.mu.Lock()
	p.closing = true
	for c := range p.conns {
		_ = c.Close()
	}
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *replyProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		if !p.track(down, up) {
			_ = down.Close()
			_ = up.Close()
			return
		}
		p.wg.Add(2)
		go func() { // commands: always through
			defer p.wg.Done()
			_, _ = io.Copy(up, down)
			_ = up.Close()
			_ = down.Close()
		}()
		go func() { // replies: held at the gate
			defer p.wg.Done()
			defer up.Close()
			defer down.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					if g := p.gate(); g != nil {
						<-g
					}
					if _, werr := down.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// A write whose reply is lost may have landed, and what it changed was
// published by nobody: here bob's device went away, Redis has him away,
// and node b's viewers still hold him online. Trying the write again finds
// nothing to change. Once Redis answers node a again, every node resyncs
// (chaos seed 643529765: an online re-asserted as a partition healed was
// never published, and the offline that ended it came second).
func TestLostReplyMakesEveryNodeResync(t *testing.T) {
	r := redistest.Start(t)
	px := newReplyProxy(t, r.Addr())
	ctx := context.Background()
	a, ha := mkResync(t, px.url(), "a")
	b, hb := mkResync(t, r.URL(), "b")
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	// The status script loaded (a first EVALSHA's NOSCRIPT held, the
	// script itself would never be sent), and idle connections in a's pool
	// (one dialed while replies are held waits for its handshake's).
	must(t, a.SetStatus(ctx, "c1", true))
	var warm sync.WaitGroup
	for range 8 {
		warm.Go(func() { _ = a.rdb.Ping(ctx).Err() })
	}
	warm.Wait()
	a0, b0 := ha.resyncs(), hb.resyncs()

	px.hold()
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := a.SetStatus(wctx, "c1", false)
	cancel()
	if err == nil {
		t.Fatal("the status write answered while its reply was held")
	}
	ps, perr := b.Presence(ctx, []string{"bob"})
	if perr != nil || ps[0].State != presence.Away {
		t.Fatalf("bob reads %v (%v), want away: the write landed", ps, perr)
	}
	if h := hb.hist(); slices.Contains(h, "bob=away") {
		t.Fatalf("b heard %v although a never published bob away", h)
	}
	px.release()

	testwait.For(t, 10*time.Second, func() error {
		if hb.resyncs() == b0 || ha.resyncs() == a0 {
			return fmt.Errorf("resyncs since the lost reply: a %d, b %d; want both", ha.resyncs()-a0, hb.resyncs()-b0)
		}
		return nil
	})
	if got := counterValue(t, a.m.lostRepliesTold); got != 1 {
		t.Fatalf("lost replies told: %v, want 1", got)
	}
}

// statusRec records the statuses a node is told of, for the user's own
// connections.
type statusRec struct {
	resyncRec
	smu      sync.Mutex
	statuses []presence.StatusChange
}

func (r *statusRec) OnStatus(ev presence.StatusChange) {
	r.smu.Lock()
	r.statuses = append(r.statuses, ev)
	r.smu.Unlock()
}

func (r *statusRec) modeOf(user string) (presence.Mode, bool) {
	r.smu.Lock()
	defer r.smu.Unlock()
	for i := len(r.statuses) - 1; i >= 0; i-- {
		if r.statuses[i].UserID == user {
			return r.statuses[i].Status.Mode, true
		}
	}
	return 0, false
}

// A status write whose reply is lost landed, and a retry finds it set and
// publishes nothing: the user's devices on other nodes would never get
// their my_status (a resync tells viewers, not a user's own devices). It
// is sent again once Redis answers.
func TestLostStatusReplyReachesTheUsersDevices(t *testing.T) {
	r := redistest.Start(t)
	px := newReplyProxy(t, r.Addr())
	ctx := context.Background()
	a, _ := mkResync(t, px.url(), "a")
	b, err := New(ctx, Config{URL: r.URL(), Node: "b", TTL: 5 * time.Second, Grace: time.Second,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	hb := &statusRec{}
	b.Subscribe(hb)
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	// The script loaded and idle connections in a's pool, as above.
	must(t, a.SetUserStatus(ctx, "bob", presence.Status{Mode: presence.ModeAuto, Text: "here"}))
	testwait.For(t, 5*time.Second, func() error {
		if _, ok := hb.modeOf("bob"); !ok {
			return fmt.Errorf("b heard no status of bob yet")
		}
		return nil
	})
	var warm sync.WaitGroup
	for range 8 {
		warm.Go(func() { _ = a.rdb.Ping(ctx).Err() })
	}
	warm.Wait()

	px.hold()
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = a.SetUserStatus(wctx, "bob", presence.Status{Mode: presence.ModeDND})
	cancel()
	if err == nil {
		t.Fatal("the status write answered while its reply was held")
	}
	if ps, err := b.Presence(ctx, []string{"bob"}); err != nil || ps[0].Status.Mode != presence.ModeDND {
		t.Fatalf("bob reads %v (%v), want dnd: the write landed", ps, err)
	}
	px.release()
	// What a retry of the write does: nothing to change, nothing published.
	must(t, a.SetUserStatus(ctx, "bob", presence.Status{Mode: presence.ModeDND}))
	testwait.For(t, 10*time.Second, func() error {
		if m, _ := hb.modeOf("bob"); m != presence.ModeDND {
			return fmt.Errorf("b holds bob's mode %v, want dnd", m)
		}
		return nil
	})
}

// An error that is Redis's own answer ran the script to its end, or ran
// nothing (CLUSTERDOWN and the like); a refused connection, and a deadline
// that passed while waiting for a connection, sent nothing: no reply is
// lost, and nobody resyncs for them. A read that timed out, or a
// connection closed under the call, may hide a write that landed.
func TestAnsweredErrorIsNoLostReply(t *testing.T) {
	r := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	ctx := context.Background()
	var sentNothing []error
	for _, reply := range []string{"ERR unknown connection", "CLUSTERDOWN The cluster is down"} {
		err := c.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, reply).Err()
		if err == nil {
			t.Fatalf("%q: no error", reply)
		}
		sentNothing = append(sentNothing, err)
	}
	sentNothing = append(sentNothing, c.Get(ctx, "absent").Err()) // redis.Nil
	// A port nothing listens on: the dial fails.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	dc := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1})
	defer dc.Close()
	sentNothing = append(sentNothing, dc.Ping(ctx).Err(), context.DeadlineExceeded, redis.ErrPoolTimeout)
	for _, err := range sentNothing {
		if err == nil || replyLost(err) {
			t.Errorf("%v: taken for a lost reply (or no error at all)", err)
		}
	}
	mayHaveRun := []error{
		&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded},
		fmt.Errorf("redisstore: status: %w", io.EOF),
	}
	for _, err := range mayHaveRun {
		if !replyLost(err) {
			t.Errorf("%v: not taken for a lost reply", err)
		}
	}
}
