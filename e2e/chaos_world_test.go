package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// The chaos world: greendot processes that can be killed, drained and
// restarted on the same address and node id; devices (Go clients) that reach
// them through an in-process load balancer; and the record of everything
// that truly happened, which the oracle (chaos_oracle_test.go) judges the
// viewers' screens against.

// chaosNode is one greendot process and its restarts.
type chaosNode struct {
	name, addr, redisURL string
	pprofAddr            string // for goroutine dumps of a node that did not settle
	tm                   timing
	logPath              string

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{} // closed when the current process has exited
	accepting bool          // the load balancer may send connects here
	starts    int
}

func (n *chaosNode) start() error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.starts++
	fmt.Fprintf(logf, "=== start %d of %s at %s\n", n.starts, n.name, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(binary, "serve", "--addr", n.addr, "--store", "redis", "--redis-url", n.redisURL,
		"--node-id", n.name, "--ttl", n.tm.ttl.String(), "--heartbeat-interval", n.tm.heartbeat.String(),
		"--offline-grace", n.tm.grace.String(), "--pprof-addr", n.pprofAddr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = redistest.DieWithParent()
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	return n.waitReady(15 * time.Second)
}

// dumpGoroutines writes the stacks of the node's goroutines to path.
func (n *chaosNode) dumpGoroutines(path string) error {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + n.pprofAddr + "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (n *chaosNode) waitReady(d time.Duration) error {
	hc := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-n.exited():
			return fmt.Errorf("%s exited while starting", n.name)
		default:
		}
		resp, err := hc.Get("http://" + n.addr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v: %s", n.name, d, last)
}

func (n *chaosNode) exited() chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return n.done
}

func (n *chaosNode) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// kill is kill -9, waited for.
func (n *chaosNode) kill() {
	n.signal(syscall.SIGKILL)
	<-n.exited()
}

// drain sends SIGTERM and waits for the exit; false if it took longer than d
// (the process is then killed).
func (n *chaosNode) drain(d time.Duration) bool {
	n.signal(syscall.SIGTERM)
	select {
	case <-n.exited():
		return true
	case <-time.After(d):
		n.kill()
		return false
	}
}

func (n *chaosNode) setAccepting(on bool) {
	n.mu.Lock()
	n.accepting = on
	n.mu.Unlock()
}

func (n *chaosNode) isAccepting() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.accepting
}

// interval is [from, to); a zero to is open.
type interval struct{ from, to time.Time }

func (iv interval) contains(t time.Time) bool {
	return !t.Before(iv.from) && (iv.to.IsZero() || t.Before(iv.to))
}

// overlaps reports whether iv meets [a, b].
func (iv interval) overlaps(a, b time.Time) bool {
	return !iv.from.After(b) && (iv.to.IsZero() || !iv.to.Before(a))
}

// session is one connection of a device, from the client's Connected to the
// moment it ended (the harness's own act when it caused the end).
type session struct {
	start, end time.Time // end zero while open
	node       string
	raw        *rawConn
	hint       time.Time // the harness ended it (close, drop, kill) at this moment
	hintKind   string
	endKind    string
}

type attempt struct {
	from, to time.Time
	node     string
	ok       bool
}

type statusChange struct {
	at    time.Time
	state string
}

type devState int

const (
	devDialing devState = iota
	devOpen
	devFrozen
	devClosed
)

// device is one client.Client: a device of a user, and a viewer.
type device struct {
	w    *world
	id   int
	user string
	name string

	// Guarded by w.mu: what the scheduler may do with it.
	state       devState
	c           *client.Client
	thawAt      time.Time // a frozen device is thawed (or closed) then
	thawToClose bool

	mu       sync.Mutex
	sessions []*session
	cur      *session
	attempts []*attempt
	pending  *attempt
	freezes  []interval
	statuses []statusChange
	changes  []client.Change
	raws     []*rawConn
	lastRaw  *rawConn
	closedAt time.Time
	dialErr  error
}

func (d *device) String() string { return fmt.Sprintf("%s/%s", d.user, d.name) }

// dial is the load balancer: each connect goes to a node taking connects.
func (d *device) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	n := d.w.pickNode()
	now := time.Now()
	d.mu.Lock()
	a := &attempt{from: now}
	if n != nil {
		a.node = n.name
	}
	d.attempts = append(d.attempts, a)
	d.pending = a
	d.mu.Unlock()
	if n == nil {
		return nil, errors.New("chaos: no node takes connects")
	}
	var dl net.Dialer
	conn, err := dl.DialContext(ctx, network, n.addr)
	if err != nil {
		return nil, err
	}
	rc := &rawConn{node: n.name, dialed: now}
	tc := &tapConn{Conn: conn, rc: rc, closed: make(chan struct{})}
	rc.conn = tc
	d.mu.Lock()
	d.raws = append(d.raws, rc)
	d.lastRaw = rc
	d.mu.Unlock()
	return tc, nil
}

func (d *device) onState(sc client.StateChange) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	switch sc.State {
	case client.Connected:
		if d.pending != nil {
			d.pending.to, d.pending.ok = now, true
			d.pending = nil
		}
		s := &session{start: now}
		if d.lastRaw != nil {
			s.node, s.raw = d.lastRaw.node, d.lastRaw
		}
		d.sessions = append(d.sessions, s)
		d.cur = s
	case client.Disconnected, client.Closed:
		if d.cur != nil {
			d.endSessionLocked(now, sc)
		} else if d.pending != nil {
			d.pending.to = now
			d.pending = nil
		}
	}
}

func (d *device) endSessionLocked(now time.Time, sc client.StateChange) {
	s := d.cur
	end, kind := now, "lost"
	switch {
	case sc.State == client.Closed:
		kind = "closed"
	case sc.CloseCode != 0:
		kind = fmt.Sprintf("closed by server %d", sc.CloseCode)
	}
	if s.raw != nil {
		s.raw.mu.Lock()
		if h := s.raw.reconnect; !h.IsZero() && h.Before(end) && !h.Before(s.start) {
			end, kind = h, "drained"
		}
		if h := s.raw.closeRecv; !h.IsZero() && h.Before(end) && !h.Before(s.start) {
			end = h
		}
		s.raw.mu.Unlock()
	}
	if !s.hint.IsZero() && s.hint.Before(end) {
		end, kind = s.hint, s.hintKind
	}
	s.end, s.endKind = end, kind
	d.cur = nil
}

// hintEnd marks that the harness ends the current session now, by kind.
func (d *device) hintEnd(kind string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur != nil && d.cur.hint.IsZero() {
		d.cur.hint, d.cur.hintKind = at, kind
	}
}

func (d *device) curNode() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil {
		return ""
	}
	return d.cur.node
}

func (d *device) curRaw() *rawConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil {
		return nil
	}
	return d.cur.raw
}

func (d *device) onChange(ch client.Change) {
	d.mu.Lock()
	d.changes = append(d.changes, ch)
	d.mu.Unlock()
}

func (d *device) wantedStatus() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.statuses) == 0 {
		return "online"
	}
	return d.statuses[len(d.statuses)-1].state
}

// memberSpan is a user's membership of a team as the harness made it. It
// may hold from the moment the PUT was sent to the moment the DELETE was
// answered (interval), and surely holds from the PUT's answer to the
// DELETE's sending (joined, leaving; joined zero if the PUT never got its
// 204).
type memberSpan struct {
	team, user string
	interval
	joined, leaving time.Time
}

// certain is when the membership surely held.
func (s *memberSpan) certain() (interval, bool) {
	if s.joined.IsZero() || (!s.leaving.IsZero() && !s.leaving.After(s.joined)) {
		return interval{}, false
	}
	return interval{from: s.joined, to: s.leaving}, true
}

// faultWindow is a fault from its start to the moment it was over (the
// process restarted and ready, Redis answering again, the network healed).
type faultWindow struct {
	kind  string
	node  string // the greendot node it touched; "" for Redis-wide faults
	redis bool   // it touches Redis for everyone
	interval
	detail string
	// started: of a node's restart, when its new process was started
	// (before to, when it answered).
	started time.Time
}

type world struct {
	t     *testing.T
	cfg   chaosConfig
	start time.Time // the chaos begins
	end   time.Time // the faults stop
	rng   *rand.Rand

	lbMu  sync.Mutex
	lbRng *rand.Rand

	nodes []*chaosNode
	topo  redisTopology
	api   *http.Client

	mu       sync.Mutex
	devices  []*device
	members  map[string]map[string]bool // team → user → member now
	spans    []*memberSpan
	busyPair map[string]bool
	faults   []*faultWindow
	counts   map[string]int
	notes    []string // harness-side events worth printing (failed connects...)
	nextID   int

	bg sync.WaitGroup // device dials, closes, membership calls, faults
}

func (w *world) since(t time.Time) string {
	if w.start.IsZero() {
		return "setup"
	}
	return fmt.Sprintf("+%.2fs", t.Sub(w.start).Seconds())
}

func (w *world) count(kind string) {
	w.mu.Lock()
	w.counts[kind]++
	w.mu.Unlock()
}

func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	if len(w.notes) < 200 {
		w.notes = append(w.notes, fmt.Sprintf("%s ", w.since(time.Now()))+fmt.Sprintf(format, args...))
	}
	w.mu.Unlock()
}

func (w *world) pickNode() *chaosNode {
	var ok []*chaosNode
	for _, n := range w.nodes {
		if n.isAccepting() {
			ok = append(ok, n)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	w.lbMu.Lock()
	defer w.lbMu.Unlock()
	return ok[w.lbRng.IntN(len(ok))]
}

func (w *world) node(name string) *chaosNode {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// call makes one HTTP API request to a node.
func (w *world) call(n *chaosNode, method, path string) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+n.addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := w.api.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// newDevice starts connecting a new device of user through the balancer.
func (w *world) newDevice(user string) {
	w.mu.Lock()
	w.nextID++
	d := &device{w: w, id: w.nextID, user: user, name: fmt.Sprintf("d%d", w.nextID), state: devDialing}
	w.devices = append(w.devices, d)
	w.mu.Unlock()
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		hc := &http.Client{Transport: &http.Transport{DialContext: d.dial, DisableKeepAlives: true}}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, "ws://greendot.chaos/v1/connect", client.Options{
			User: user, Device: d.name, HTTPClient: hc,
			OnChange: d.onChange, OnStateChange: d.onState, DisableChanges: true,
			ReconnectBase: 500 * time.Millisecond, ReconnectMax: 3 * time.Second,
			DialTimeout: 5 * time.Second, WriteTimeout: 3 * time.Second,
			Logger: slog.New(slog.DiscardHandler),
		})
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil {
			d.state = devClosed
			d.mu.Lock()
			d.dialErr, d.closedAt = err, time.Now()
			d.mu.Unlock()
			w.counts["connect failed"]++
			if len(w.notes) < 200 {
				w.notes = append(w.notes, fmt.Sprintf("%s connect of %s failed: %v", w.since(time.Now()), d, err))
			}
			return
		}
		d.c = c
		if d.state == devDialing {
			d.state = devOpen
		}
	}()
}

// closeDevice closes a device cleanly (a close frame): the user left.
func (w *world) closeDevice(d *device, kind string) {
	now := time.Now()
	d.hintEnd(kind, now)
	d.mu.Lock()
	if !d.frozen().IsZero() {
		d.freezes[len(d.freezes)-1].to = now
	}
	d.closedAt = now
	d.mu.Unlock()
	d.unblockReads()
	w.mu.Lock()
	c := d.c
	d.state = devClosed
	w.mu.Unlock()
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		_ = c.Close()
	}()
}

// unblockReads lets a frozen device's sockets be read again, so that its
// client can be closed.
func (d *device) unblockReads() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, rc := range d.raws {
		rc.setFrozen(false)
	}
}

// frozen returns when the open freeze began; d.mu held.
func (d *device) frozen() time.Time {
	if n := len(d.freezes); n > 0 && d.freezes[n-1].to.IsZero() {
		return d.freezes[n-1].from
	}
	return time.Time{}
}

// dropDevice kills the device's socket without a close frame (RST). With
// back, the client reconnects by itself (a network blip); without, the
// device is gone (a phone that died).
func (w *world) dropDevice(d *device, back bool) {
	raw := d.curRaw()
	if raw == nil {
		return
	}
	now := time.Now()
	c := d.c
	if !back {
		c.Freeze(true) // no reconnect, no close frame
		w.mu.Lock()
		d.state = devClosed
		w.mu.Unlock()
		d.mu.Lock()
		d.closedAt = now
		d.mu.Unlock()
		d.hintEnd("dropped", now)
	} else {
		d.hintEnd("blip", now)
	}
	if tc, ok := raw.conn.Conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = raw.conn.Close()
	if !back {
		w.bg.Add(1)
		go func() {
			defer w.bg.Done()
			_ = c.Close()
		}()
	}
}

// freezeDevice makes a hung client: it stops sending (heartbeats, pongs)
// and reading, its socket open.
func (w *world) freezeDevice(d *device) {
	now := time.Now()
	d.c.Freeze(true)
	d.mu.Lock()
	d.freezes = append(d.freezes, interval{from: now})
	for _, rc := range d.raws {
		rc.setFrozen(true)
	}
	d.mu.Unlock()
	w.mu.Lock()
	d.state = devFrozen
	w.mu.Unlock()
}

func (w *world) thawDevice(d *device) {
	now := time.Now()
	d.mu.Lock()
	if n := len(d.freezes); n > 0 && d.freezes[n-1].to.IsZero() {
		d.freezes[n-1].to = now
	}
	for _, rc := range d.raws {
		rc.setFrozen(false)
	}
	d.mu.Unlock()
	d.c.Freeze(false)
	w.mu.Lock()
	d.state = devOpen
	w.mu.Unlock()
}

func (w *world) setStatus(d *device, state string) {
	d.mu.Lock()
	d.statuses = append(d.statuses, statusChange{at: time.Now(), state: state})
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.c.SetStatus(ctx, state); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		w.note("status %s of %s: %v", state, d, err)
	}
}

// setMember puts user into team or takes them out, through any node that
// takes requests, retrying on another until it is answered 204.
func (w *world) setMember(team, user string, join bool) {
	key := team + "/" + user
	w.mu.Lock()
	if w.busyPair[key] {
		w.mu.Unlock()
		return
	}
	w.busyPair[key] = true
	var span *memberSpan
	now := time.Now()
	if join {
		span = &memberSpan{team: team, user: user, interval: interval{from: now}}
		w.spans = append(w.spans, span)
		w.members[team][user] = true
	} else {
		for _, s := range w.spans {
			if s.team == team && s.user == user && s.to.IsZero() {
				span = s
			}
		}
		if span != nil {
			span.leaving = now
		}
		w.members[team][user] = false
	}
	w.mu.Unlock()
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		ok := w.memberCall(team, user, join, 8*time.Second)
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.busyPair, key)
		switch {
		case !join && span != nil:
			span.to = time.Now()
		case join && ok:
			span.joined = time.Now()
		}
		if !ok {
			w.counts["membership call failed"]++
		}
	}()
}

func (w *world) memberCall(team, user string, join bool, within time.Duration) bool {
	method := "DELETE"
	if join {
		method = "PUT"
	}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		n := w.pickNode()
		if n == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		code, body, err := w.call(n, method, "/v1/teams/"+team+"/members/"+user)
		if err == nil && code == 204 {
			return true
		}
		w.note("%s %s/%s on %s: %d %s %v", method, team, user, n.name, code, strings.TrimSpace(body), err)
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// restoreMembership writes every membership the harness holds back into
// Redis, as an operator restores it after Redis lost its data.
func (w *world) restoreMembership() {
	w.mu.Lock()
	var pairs [][2]string
	for team, users := range w.members {
		for u, in := range users {
			if in {
				pairs = append(pairs, [2]string{team, u})
			}
		}
	}
	w.mu.Unlock()
	slices.SortFunc(pairs, func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) })
	for _, p := range pairs {
		if !w.memberCall(p[0], p[1], true, 10*time.Second) {
			w.note("restore %s/%s failed", p[0], p[1])
		}
	}
}

func (w *world) openFault(kind, node string, redis bool, detail string) *faultWindow {
	f := &faultWindow{kind: kind, node: node, redis: redis, interval: interval{from: time.Now()}, detail: detail}
	w.mu.Lock()
	w.faults = append(w.faults, f)
	w.counts[kind]++
	w.mu.Unlock()
	return f
}

func (w *world) closeFault(f *faultWindow) {
	w.mu.Lock()
	f.to = time.Now()
	w.mu.Unlock()
}

// hintNode marks the sessions on a node as ended by the harness now.
func (w *world) hintNode(name, kind string) {
	now := time.Now()
	w.mu.Lock()
	devs := slices.Clone(w.devices)
	w.mu.Unlock()
	for _, d := range devs {
		if d.curNode() == name {
			d.hintEnd(kind, now)
		}
	}
}

// restartNode kills (or drains) a node, waits, and starts it again on the
// same address with the same node id.
func (w *world) restartNode(n *chaosNode, drain bool, down time.Duration) {
	kind := "kill -9"
	if drain {
		kind = "drain"
	}
	f := w.openFault(kind, n.name, false, fmt.Sprintf("down %v", down.Round(10*time.Millisecond)))
	defer w.closeFault(f)
	n.setAccepting(false)
	if drain {
		if !n.drain(25 * time.Second) {
			w.note("%s did not exit within 25s of SIGTERM", n.name)
			w.count("drain did not exit")
		}
	} else {
		w.hintNode(n.name, "node killed")
		n.kill()
	}
	time.Sleep(down)
	w.mu.Lock()
	f.started = time.Now()
	w.mu.Unlock()
	if err := n.start(); err != nil {
		w.note("restart of %s: %v", n.name, err)
		w.count("restart failed")
		// Try once more; the oracle judges whatever follows.
		if err := n.start(); err != nil {
			w.note("second restart of %s: %v", n.name, err)
			return
		}
	}
	n.setAccepting(true)
}
