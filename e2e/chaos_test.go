package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// TestChaos runs real greendot processes on a real Redis (and on a local
// Redis Cluster) with real client connections, injects faults at random
// from a printed seed, and judges every viewer against the truth the
// harness knows (chaos_oracle_test.go says exactly what is checked).
//
//	GREENDOT_CHAOS_SEED=N       replay a run (the seed is printed at the start and in failures)
//	GREENDOT_CHAOS_DURATION=10m length of the fault phase per topology (default 1m)
//	GREENDOT_CHAOS_LOGDIR=dir   keep the nodes' logs there
//
// docs/reliability.md lists what is guaranteed, what is not covered, and the
// figures of recorded runs.
func TestChaos(t *testing.T) {
	seed := uint64(time.Now().UnixNano() % 1_000_000_000)
	if s := os.Getenv("GREENDOT_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GREENDOT_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	duration := time.Minute
	if s := os.Getenv("GREENDOT_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 5*time.Second {
			t.Fatalf("GREENDOT_CHAOS_DURATION=%q: want a Go duration of 5s or more (%v)", s, err)
		}
		duration = d
	}
	t.Logf("chaos seed %d (replay: GREENDOT_CHAOS_SEED=%d go test -run 'TestChaos' ./e2e), %v of faults per topology", seed, seed, duration)
	failed := map[string][]string{}
	var topos []string
	for _, topo := range []string{"redis", "cluster"} {
		var verdict []string
		if !t.Run(topo, func(t *testing.T) {
			verdict = runChaos(t, chaosConfig{topology: topo, seed: seed, duration: duration,
				users: 24, teams: 4, devices: 30, perUser: 2,
				tm: timing{ttl: 3 * time.Second, heartbeat: time.Second, grace: 1500 * time.Millisecond}})
		}) {
			if len(verdict) == 0 {
				verdict = []string{"stopped before the oracle judged the run: its output above says why"}
			}
			failed[topo], topos = verdict, append(topos, topo)
		}
	}
	// Said again at the very end, whatever ran after a failing topology: CI
	// shows only the end of the output.
	for _, topo := range topos {
		t.Logf("FAILED %s, seed %d (replay: GREENDOT_CHAOS_SEED=%d GREENDOT_CHAOS_DURATION=%v go test -count=1 -run '^TestChaos$/^%s$' -v ./e2e):\n  %s",
			topo, seed, seed, duration, topo, strings.Join(failed[topo], "\n  "))
	}
}

type chaosConfig struct {
	topology string
	seed     uint64
	duration time.Duration
	users    int // u00…
	teams    int // t0…
	devices  int // open devices the churn keeps near
	perUser  int // open devices per user at most
	tm       timing
}

func (c chaosConfig) userIDs() []string {
	out := make([]string, c.users)
	for i := range out {
		out[i] = fmt.Sprintf("u%02d", i)
	}
	return out
}

func (c chaosConfig) teamIDs() []string {
	out := make([]string, c.teams)
	for i := range out {
		out[i] = fmt.Sprintf("t%d", i)
	}
	return out
}

// runChaos returns the kinds of violation it failed on, each with its first
// few instances.
func runChaos(t *testing.T, cfg chaosConfig) []string {
	w := &world{t: t, cfg: cfg,
		api:     &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		members: map[string]map[string]bool{}, busyPair: map[string]bool{}, counts: map[string]int{}}
	w.rng, w.lbRng = w.rand(0), w.rand(2<<32)
	t.Cleanup(w.api.CloseIdleConnections)
	logDir := os.Getenv("GREENDOT_CHAOS_LOGDIR")
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	redisUp := time.Now()
	switch cfg.topology {
	case "redis":
		r := startChaosRedis(t, 3)
		w.topo = r
	case "cluster":
		w.topo = startChaosCluster(t, 3)
	}
	for i, name := range []string{"a", "b", "c"} {
		n := &chaosNode{name: name, addr: freeAddr(t), pprofAddr: freeAddr(t), redisURL: w.topo.url(i), tm: cfg.tm,
			logPath: filepath.Join(logDir, fmt.Sprintf("%s-%s-%d.log", cfg.topology, name, cfg.seed))}
		if err := n.start(); err != nil {
			t.Fatalf("%v\n%s", err, tail(n.logPath, 20))
		}
		n.setAccepting(true)
		w.nodes = append(w.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range w.nodes {
			n.kill()
		}
	})

	// Teams: everyone in one or two.
	teams := cfg.teamIDs()
	for _, team := range teams {
		w.members[team] = map[string]bool{}
	}
	for _, u := range cfg.userIDs() {
		k := 1 + w.rng.IntN(2)
		for _, i := range w.rng.Perm(len(teams))[:k] {
			w.members[teams[i]][u] = true
			span := &memberSpan{team: teams[i], user: u, interval: interval{from: time.Now()}}
			w.spans = append(w.spans, span)
			if !w.memberCall(teams[i], u, true, 10*time.Second) {
				t.Fatalf("could not add %s to %s", u, teams[i])
			}
			span.joined = time.Now()
		}
	}
	// Devices: one per user, then more up to the target.
	users := cfg.userIDs()
	for _, u := range users {
		w.newDevice(u)
	}
	for i := len(users); i < cfg.devices; i++ {
		w.newDevice(users[w.rng.IntN(len(users))])
	}
	defer w.closeAll()
	checkFor(t, 20*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, d := range w.devices {
			if d.state == devDialing {
				return fmt.Errorf("%s still connecting", d)
			}
		}
		return nil
	})
	// Past the start-up hold-off of a fresh Redis.
	time.Sleep(time.Until(redisUp.Add(holdOff + time.Second)))

	w.start = time.Now()
	t.Logf("%s: 3 nodes, %d users in %d teams, ~%d devices; ttl %v, heartbeat %v, grace %v; faults for %v from %s",
		cfg.topology, cfg.users, cfg.teams, cfg.devices, cfg.tm.ttl, cfg.tm.heartbeat, cfg.tm.grace, cfg.duration, w.start.Format("15:04:05"))
	w.run()
	w.end = time.Now()

	// Settle: everything is up and healed; wait for agreement.
	w.bg.Wait()
	for _, n := range w.nodes {
		select {
		case <-n.exited():
			t.Logf("%s is not running after the faults; starting it", n.name)
			if err := n.start(); err != nil {
				t.Errorf("%v", err)
			}
			n.setAccepting(true)
		default:
		}
	}
	settleFrom := time.Now()
	var problems []string
	minWait := cfg.tm.ttl + cfg.tm.grace + 2*time.Second
	deadline := settleFrom.Add(30 * time.Second)
	for {
		time.Sleep(250 * time.Millisecond)
		problems = w.settleCheck()
		if len(problems) == 0 && time.Since(settleFrom) >= minWait {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	settled := time.Now()
	if len(problems) > 0 && os.Getenv("GREENDOT_CHAOS_LOGDIR") != "" {
		// What each node was doing when it did not settle: a node that
		// stopped hearing (a stuck loop) shows where it waits.
		for _, n := range w.nodes {
			path := filepath.Join(logDir, fmt.Sprintf("%s-%s-%d-goroutines.txt", cfg.topology, n.name, cfg.seed))
			if err := n.dumpGoroutines(path); err != nil {
				t.Logf("goroutines of %s: %v", n.name, err)
			}
		}
	}

	o := newOracle(w, w.start, settled)
	o.judgeChanges()
	o.judgeFrames()
	o.judgeScreens()
	for _, p := range problems {
		kind := "lost"
		if strings.HasPrefix(p, "http") {
			kind = "lost (http)"
		} else if strings.HasPrefix(p, "harness") {
			kind = "not settled"
		}
		o.violate(kind, "%s", p)
	}
	if os.Getenv("GREENDOT_CHAOS_LOGDIR") != "" {
		path := filepath.Join(logDir, fmt.Sprintf("%s-%d-events.txt", cfg.topology, cfg.seed))
		if err := o.dump(path); err != nil {
			t.Errorf("dump: %v", err)
		} else {
			t.Logf("the run's record: %s", path)
		}
	}
	return w.report(o, settled.Sub(settleFrom), len(problems) == 0)
}

// run is the scheduler: a client action every 150-350 ms, and a node or
// Redis fault at a time, from a plan drawn at the start (a shuffled deck of
// every kind, about every 5-8 s). Each fault and each tick draws from its
// own generator, derived from the seed, so that a replay makes the same
// decisions even where the world answers differently.
func (w *world) run() {
	plan := w.planFaults()
	bigDone := make(chan struct{}, 1)
	busy := false
	for tick := uint64(0); time.Since(w.start) < w.cfg.duration; tick++ {
		r := w.rand(1<<32 + tick)
		time.Sleep(jit(r, 150*time.Millisecond, 350*time.Millisecond))
		w.dueFreezes(false)
		w.clientAction(r)
		select {
		case <-bigDone:
			busy = false
		default:
		}
		if !busy && len(plan) > 0 && time.Since(w.start) >= plan[0].at {
			f := plan[0].run
			plan = plan[1:]
			busy = true
			w.bg.Add(1)
			go func() {
				defer w.bg.Done()
				f()
				bigDone <- struct{}{}
			}()
		}
	}
	if busy {
		<-bigDone
	}
	w.dueFreezes(true)
}

// rand is the generator of one decision stream, derived from the seed.
func (w *world) rand(stream uint64) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(w.cfg.topology))
	return rand.New(rand.NewPCG(w.cfg.seed, h.Sum64()^stream))
}

func jit(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

type plannedFault struct {
	at   time.Duration // from the start; later if the previous one still runs
	kind string
	run  func()
}

func (w *world) planFaults() []plannedFault {
	kinds := []string{"kill -9", "kill -9", "drain", "redis restart", "redis restart empty", "flushall",
		"partition short", "partition long", "latency"}
	if _, ok := w.topo.(*chaosCluster); ok {
		kinds = append(kinds, "failover") // one Redis has no replica to take over
	}
	// GREENDOT_CHAOS_SKIP leaves fault kinds out (comma-separated): CI
	// leaves out those that still break a guarantee (docs/reliability.md).
	if skip := os.Getenv("GREENDOT_CHAOS_SKIP"); skip != "" {
		kinds = slices.DeleteFunc(kinds, func(k string) bool {
			return slices.Contains(strings.Split(skip, ","), k)
		})
	}
	r := w.rand(1)
	var plan []plannedFault
	at := jit(r, 2*time.Second, 4*time.Second)
	var deck []string
	for k := uint64(0); at < w.cfg.duration-5*time.Second; k++ {
		if len(deck) == 0 {
			deck = slices.Clone(kinds)
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		plan = append(plan, plannedFault{at: at, kind: deck[0], run: w.prepare(deck[0], w.rand(2+k))})
		deck = deck[1:]
		at += jit(r, 5*time.Second, 8*time.Second)
	}
	return plan
}

// prepare draws a fault's parameters and returns it.
func (w *world) prepare(kind string, r *rand.Rand) func() {
	n := w.nodes[r.IntN(len(w.nodes))]
	switch kind {
	case "kill -9":
		down := jit(r, 200*time.Millisecond, 3*time.Second)
		return func() { w.restartNode(n, false, down) }
	case "drain":
		down := jit(r, 0, 1500*time.Millisecond)
		return func() { w.restartNode(n, true, down) }
	}
	return w.topo.prepare(w, kind, r)
}

// redisTopology is the Redis side's faults.
type redisTopology interface {
	url(node int) string
	prepare(w *world, kind string, r *rand.Rand) func()
	servers() []*redistest.Server
}

func (rd *chaosRedis) prepare(w *world, kind string, r *rand.Rand) func() {
	i := r.IntN(len(rd.proxies))
	node := w.nodes[i].name
	p := rd.proxies[i]
	switch kind {
	case "redis restart", "redis restart empty":
		down := jit(r, 500*time.Millisecond, 5*time.Second)
		empty := kind == "redis restart empty"
		return func() {
			f := w.openFault(kind, "", true, fmt.Sprintf("down %v", down.Round(10*time.Millisecond)))
			defer w.closeFault(f)
			if err := restartRedis(w.t, rd.srv, down, empty); err != nil {
				w.note("%s: %v", kind, err)
			}
			if empty {
				w.restoreMembership()
			}
		}
	case "flushall":
		return func() {
			f := w.openFault(kind, "", true, "")
			defer w.closeFault(f)
			if _, err := rd.srv.Do("FLUSHALL"); err != nil {
				w.note("FLUSHALL: %v", err)
			}
			w.restoreMembership()
		}
	case "partition short", "partition long":
		d := jit(r, time.Second, 1800*time.Millisecond)
		if kind == "partition long" {
			d = jit(r, 4500*time.Millisecond, 7*time.Second)
		}
		return func() {
			f := w.openFault("partition "+d.Round(10*time.Millisecond).String(), node, false, "")
			p.Partition()
			time.Sleep(d)
			p.Heal()
			w.closeFault(f)
		}
	case "latency":
		lat := jit(r, 50*time.Millisecond, 300*time.Millisecond)
		d := jit(r, 2*time.Second, 5*time.Second)
		return func() {
			f := w.openFault("latency "+lat.Round(time.Millisecond).String(), node, false, fmt.Sprintf("for %v", d.Round(10*time.Millisecond)))
			p.SetLatency(lat)
			time.Sleep(d)
			p.SetLatency(0)
			w.closeFault(f)
		}
	}
	panic("unknown fault " + kind)
}

func (c *chaosCluster) prepare(w *world, kind string, r *rand.Rand) func() {
	i := r.IntN(len(c.shards))
	label := fmt.Sprintf("shard %d's master", i)
	switch kind {
	case "redis restart", "redis restart empty":
		down := jit(r, 500*time.Millisecond, 4*time.Second)
		empty := kind == "redis restart empty"
		return func() {
			m, _ := c.master(i)
			f := w.openFault(kind, "", true, fmt.Sprintf("%s down %v", label, down.Round(10*time.Millisecond)))
			// Down longer than the node timeout (2 s), the master is
			// replaced by its replica, and comes back as the heir's replica.
			if err := restartRedis(w.t, c.all[m], down, empty); err != nil {
				w.note("%s: %v", kind, err)
			}
			if err := c.waitServing(20 * time.Second); err != nil {
				w.note("%s: %v", kind, err)
			}
			if empty {
				w.restoreMembership()
			}
			w.closeFault(f)
			c.replicasSynced(w, kind)
		}
	case "failover":
		// Planned (CLUSTER FAILOVER: the master hands over once its
		// replica has every write) or not (the master killed: the cluster
		// elects the replica after the node timeout, and writes not yet
		// replicated are lost; the old master comes back as a replica).
		planned := r.IntN(2) == 0
		down := jit(r, 0, 3*time.Second)
		return func() {
			m, heir := c.master(i)
			detail := fmt.Sprintf("shard %d planned", i)
			if !planned {
				detail = fmt.Sprintf("shard %d, master killed, back after %v", i, down.Round(10*time.Millisecond))
			}
			f := w.openFault(kind, "", true, detail)
			if planned {
				if _, err := c.all[heir].Do("CLUSTER", "FAILOVER"); err != nil {
					w.closeFault(f)
					w.note("CLUSTER FAILOVER: %v", err)
					return
				}
			} else {
				c.all[m].Stop()
			}
			for deadline := time.Now().Add(20 * time.Second); role(c.all[heir]) != "master"; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					w.note("failover: %s no master within 20 s", c.all[heir].Addr())
					break
				}
			}
			if !planned {
				time.Sleep(down)
				c.all[m].Restart()
			}
			if err := c.waitServing(20 * time.Second); err != nil {
				w.note("failover: %v", err)
			}
			w.closeFault(f)
			c.replicasSynced(w, kind)
		}
	case "flushall":
		return func() {
			f := w.openFault(kind, "", true, "every master")
			defer w.closeFault(f)
			for _, s := range c.masters() {
				if _, err := s.Do("FLUSHALL"); err != nil {
					w.note("FLUSHALL: %v", err)
				}
			}
			w.restoreMembership()
		}
	case "partition short", "partition long":
		d := jit(r, time.Second, 1800*time.Millisecond)
		if kind == "partition long" {
			d = jit(r, 4500*time.Millisecond, 7*time.Second)
		}
		return func() {
			m, _ := c.master(i)
			p := c.proxies[m]
			f := w.openFault("partition "+d.Round(10*time.Millisecond).String(), "", true, label+" from every node")
			p.Partition()
			time.Sleep(d)
			p.Heal()
			w.closeFault(f)
		}
	case "latency":
		lat := jit(r, 50*time.Millisecond, 300*time.Millisecond)
		d := jit(r, 2*time.Second, 5*time.Second)
		return func() {
			m, _ := c.master(i)
			p := c.proxies[m]
			f := w.openFault("latency "+lat.Round(time.Millisecond).String(), "", true, fmt.Sprintf("%s for %v", label, d.Round(10*time.Millisecond)))
			p.SetLatency(lat)
			time.Sleep(d)
			p.SetLatency(0)
			w.closeFault(f)
		}
	}
	panic("unknown fault " + kind)
}

// replicasSynced waits, outside the fault's window, until every replica
// follows its master again: the next fault may be a failover, which a
// replica still syncing cannot take.
func (c *chaosCluster) replicasSynced(w *world, kind string) {
	if err := c.waitOK(30 * time.Second); err != nil {
		w.note("%s: %v", kind, err)
	}
}

// clientAction does one thing a user or an operator does.
func (w *world) clientAction(r *rand.Rand) {
	w.mu.Lock()
	var open []*device
	perUser := map[string]int{}
	for _, d := range w.devices {
		if d.state != devClosed {
			perUser[d.user]++
		}
		if d.state == devOpen {
			open = append(open, d)
		}
	}
	redisFault := false
	for _, f := range w.faults {
		if f.redis && f.to.IsZero() {
			redisFault = true
		}
	}
	w.mu.Unlock()
	total := 0
	for _, n := range perUser {
		total += n
	}
	type choice struct {
		name   string
		weight float64
	}
	connectW := 1.0
	if total < w.cfg.devices {
		connectW = 4
	}
	choices := []choice{{"connect", connectW}, {"close", 1.5}, {"drop", 1}, {"blip", 1.5},
		{"freeze", 1}, {"status", 3}, {"membership", 1.2}}
	sum := 0.0
	for _, c := range choices {
		sum += c.weight
	}
	x := r.Float64() * sum
	var pick string
	for _, c := range choices {
		if x < c.weight {
			pick = c.name
			break
		}
		x -= c.weight
	}
	if pick == "" {
		pick = "status"
	}
	var d *device
	if len(open) > 0 {
		d = open[r.IntN(len(open))]
	}
	switch pick {
	case "connect":
		users := w.cfg.userIDs()
		u := users[r.IntN(len(users))]
		if perUser[u] >= w.cfg.perUser {
			return
		}
		w.count("connect")
		w.newDevice(u)
	case "close":
		if d == nil {
			return
		}
		w.count("close")
		w.closeDevice(d, "closed")
	case "drop", "blip":
		if d == nil || d.curRaw() == nil {
			return
		}
		w.count(pick)
		w.dropDevice(d, pick == "blip")
	case "freeze":
		if d == nil {
			return
		}
		w.count("freeze")
		thawIn := jit(r, time.Second, 6*time.Second)
		toClose := r.IntN(3) == 0
		w.freezeDevice(d)
		w.mu.Lock()
		d.thawAt, d.thawToClose = time.Now().Add(thawIn), toClose
		w.mu.Unlock()
	case "status":
		if d == nil {
			return
		}
		state := "away"
		if d.wantedStatus() == "away" {
			state = "online"
		}
		w.count("status")
		w.setStatus(d, state)
	case "membership":
		if redisFault {
			return // the restore after a flush must not race a change
		}
		teams := w.cfg.teamIDs()
		users := w.cfg.userIDs()
		team, u := teams[r.IntN(len(teams))], users[r.IntN(len(users))]
		w.mu.Lock()
		in := w.members[team][u]
		n := 0
		for _, tm := range teams {
			if w.members[tm][u] {
				n++
			}
		}
		w.mu.Unlock()
		if in && n < 2 && r.IntN(3) > 0 {
			return // keep most users in some team
		}
		w.count("membership")
		w.setMember(team, u, !in)
	}
}

// dueFreezes thaws (or closes) frozen devices whose time has come, or all.
func (w *world) dueFreezes(all bool) {
	now := time.Now()
	w.mu.Lock()
	var due []*device
	for _, d := range w.devices {
		if d.state == devFrozen && (all || now.After(d.thawAt)) {
			due = append(due, d)
		}
	}
	w.mu.Unlock()
	for _, d := range due {
		if d.thawToClose && !all {
			w.closeDevice(d, "closed while frozen")
		} else {
			w.thawDevice(d)
		}
	}
}

func (w *world) closeAll() {
	w.mu.Lock()
	devs := slices.Clone(w.devices)
	w.mu.Unlock()
	for _, d := range devs {
		w.mu.Lock()
		c, st := d.c, d.state
		d.state = devClosed
		w.mu.Unlock()
		if c != nil && st != devClosed {
			d.unblockReads()
			_ = c.Close()
		}
	}
	w.bg.Wait()
}

// settleCheck compares every viewer and every node's HTTP answer with the
// truth, once nothing is failing any more.
func (w *world) settleCheck() []string {
	var problems []string
	w.mu.Lock()
	devs := slices.Clone(w.devices)
	members := map[string]map[string]bool{}
	for team, us := range w.members {
		members[team] = map[string]bool{}
		for u, in := range us {
			members[team][u] = in
		}
	}
	states := map[*device]devState{}
	for _, d := range devs {
		states[d] = d.state
	}
	w.mu.Unlock()
	truth := map[string]string{}
	conns := map[string]int{}
	var viewers []*device
	for _, d := range devs {
		if states[d] != devOpen {
			continue
		}
		if d.c.State().String() != "connected" {
			problems = append(problems, fmt.Sprintf("harness: %s is %v", d, d.c.State()))
			continue
		}
		viewers = append(viewers, d)
		conns[d.user]++
		if d.wantedStatus() == "online" {
			truth[d.user] = "online"
		} else if truth[d.user] == "" {
			truth[d.user] = "away"
		}
	}
	stateOf := func(u string) string {
		if s := truth[u]; s != "" {
			return s
		}
		return "offline"
	}
	shares := func(a, b string) bool {
		for _, us := range members {
			if us[a] && us[b] {
				return true
			}
		}
		return false
	}
	users := w.cfg.userIDs()
	for _, v := range viewers {
		for _, u := range users {
			if u == v.user || !shares(u, v.user) {
				continue
			}
			shown := "offline"
			if s, ok := v.c.Get(u); ok {
				shown = s.State
			}
			if shown != stateOf(u) {
				s, _ := v.c.Get(u)
				problems = append(problems, fmt.Sprintf("%s on %s shows %s=%s v%d, truth %s (%d devices)", v, v.curNode(), u, shown, s.Version, stateOf(u), conns[u]))
			}
		}
	}
	body, _ := json.Marshal(map[string][]string{"user_ids": users})
	for _, n := range w.nodes {
		resp, err := w.api.Post("http://"+n.addr+"/v1/presence/query", "application/json", bytes.NewReader(body))
		if err != nil {
			problems = append(problems, fmt.Sprintf("http: %s: %v", n.name, err))
			continue
		}
		var out struct {
			Users []struct {
				UserID          string `json:"user_id"`
				State           string `json:"state"`
				ConnectionCount int    `json:"connection_count"`
			} `json:"users"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			problems = append(problems, fmt.Sprintf("http: %s: %d %v", n.name, resp.StatusCode, err))
			continue
		}
		for _, p := range out.Users {
			if p.State != stateOf(p.UserID) || p.ConnectionCount != conns[p.UserID] {
				problems = append(problems, fmt.Sprintf("http: %s says %s=%s with %d connections, truth %s with %d",
					n.name, p.UserID, p.State, p.ConnectionCount, stateOf(p.UserID), conns[p.UserID]))
			}
		}
	}
	return problems
}

// report prints the figures and fails on every violation.
func (w *world) report(o *oracle, settleTook time.Duration, settled bool) []string {
	t := w.t
	cfg := w.cfg
	w.mu.Lock()
	var actions, faults []string
	for _, k := range []string{"connect", "close", "drop", "blip", "freeze", "status", "membership", "connect failed", "membership call failed", "drain did not exit", "restart failed"} {
		if n := w.counts[k]; n > 0 {
			actions = append(actions, fmt.Sprintf("%s %d", k, n))
		}
	}
	var flog []string
	for _, f := range w.faults {
		if f.from.Before(w.start) {
			continue
		}
		where := f.node
		if where == "" {
			where = "redis"
		}
		flog = append(flog, fmt.Sprintf("%s-%s %s %s %s", w.since(f.from), w.since(f.to), f.kind, where, f.detail))
		faults = append(faults, f.kind)
	}
	notes := slices.Clone(w.notes)
	w.mu.Unlock()
	counted := map[string]int{}
	for _, k := range faults {
		switch f := strings.Fields(k); f[0] {
		case "partition":
			if d, err := time.ParseDuration(f[1]); err == nil && d < 2*time.Second {
				k = "partition <2s"
			} else {
				k = "partition ≥2s"
			}
		case "latency":
			k = "latency"
		}
		counted[k]++
	}
	var fsum []string
	for k, n := range counted {
		fsum = append(fsum, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(fsum)
	all := o.lags["all"]
	var lagBy []string
	for k, ds := range o.lags {
		if k != "all" {
			lagBy = append(lagBy, fmt.Sprintf("%s: n=%d p50 %v max %v", k, len(ds), percentile(ds, .5).Round(10*time.Millisecond), percentile(ds, 1).Round(10*time.Millisecond)))
		}
	}
	slices.Sort(lagBy)
	var b strings.Builder
	fmt.Fprintf(&b, "chaos %s seed %d: %v of faults, settled %v after (%v)\n", cfg.topology, cfg.seed, cfg.duration, settleTook.Round(100*time.Millisecond), settled)
	fmt.Fprintf(&b, "  faults: %s\n", strings.Join(fsum, ", "))
	for _, l := range flog {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	fmt.Fprintf(&b, "  client actions: %s\n", strings.Join(actions, ", "))
	fmt.Fprintf(&b, "  transitions %d, changes observed %d, entries on the wire %d, restatements %d (online %d, away %d, offline %d), resent in a recovery %d\n",
		o.transitions(), o.fig["changes observed"], o.fig["entries received"], o.fig["restatements"], o.fig["restatements online"], o.fig["restatements away"], o.fig["restatements offline"], o.fig["resent in a recovery"])
	fmt.Fprintf(&b, "  ghost-seconds %.1f (episodes %d), false offlines %d, released after a node was cut off %d, degraded-seconds %.1f (excused by Redis/network faults)\n",
		o.secs["ghost-seconds"].Seconds(), o.fig["ghost episodes"], o.fig["false offline"], o.fig["released (node cut off)"], o.secs["degraded-seconds"].Seconds())
	fmt.Fprintf(&b, "  lost %d (after settling: viewers %d, http %d; during the run: missed online %d, wrong status %d), doubled %d, resent %d, spurious %d, out of order %d, visibility %d (at a heal on a cluster, allowed: %d), self %d\n",
		o.fig["lost"]+o.fig["lost (http)"]+o.fig["missed online episodes"]+o.fig["wrong status episodes"], o.fig["lost"], o.fig["lost (http)"],
		o.fig["missed online episodes"], o.fig["wrong status episodes"], o.fig["doubled"], o.fig["resent"], o.fig["spurious"], o.fig["out of order"], o.fig["visibility"], o.fig["visibility at a heal (cluster)"], o.fig["self"])
	fmt.Fprintf(&b, "  offline lag (last device gone → a viewer shows offline), outside Redis and network faults: n=%d p50 %v max %v; by how the last device went:\n",
		len(all), percentile(all, .5).Round(10*time.Millisecond), percentile(all, 1).Round(10*time.Millisecond))
	for _, l := range lagBy {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	t.Log(b.String())
	kinds := make([]string, 0, len(o.violations))
	for k := range o.violations {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	// GREENDOT_CHAOS_TOLERATE lists violation kinds reported but not failed
	// (comma-separated): CI tolerates those of a finding still open
	// (docs/reliability.md).
	tolerate := strings.Split(os.Getenv("GREENDOT_CHAOS_TOLERATE"), ",")
	var failing, verdict []string
	for _, k := range kinds {
		if !slices.Contains(tolerate, k) {
			failing = append(failing, k)
		}
	}
	// The nodes' logs first, the violations last: CI shows the end of the
	// output.
	if len(failing) > 0 || t.Failed() {
		if dir := os.Getenv("GREENDOT_CHAOS_LOGDIR"); dir != "" {
			w.keepRedisData(dir)
		}
		if len(notes) > 0 {
			t.Logf("harness notes:\n  %s", strings.Join(notes, "\n  "))
		}
		for _, n := range w.nodes {
			t.Logf("warnings and errors of node %s (%s):\n%s", n.name, n.logPath, warnLines(n.logPath, 40))
		}
	}
	for _, k := range kinds {
		if slices.Contains(tolerate, k) {
			t.Logf("seed %d %s: %d %s (tolerated: an open finding):\n  %s", cfg.seed, cfg.topology, o.fig[k], k, strings.Join(o.violations[k], "\n  "))
			continue
		}
		t.Errorf("seed %d %s: %d %s:\n  %s", cfg.seed, cfg.topology, o.fig[k], k, strings.Join(o.violations[k], "\n  "))
		first := o.violations[k]
		if len(first) > 3 {
			first = append(first[:3:3], fmt.Sprintf("… %d more", len(first)-3))
		}
		verdict = append(verdict, fmt.Sprintf("%d %s: %s", o.fig[k], k, strings.Join(first, "; ")))
	}
	if len(verdict) == 0 && t.Failed() {
		verdict = append(verdict, "no violation, but the run failed: its output above says why")
	}
	return verdict
}

// keepRedisData copies each Redis's AOFs (appendfsync always, a timestamp
// line a second: every write, scripts as their effects; appendonlydir-N
// those from before an empty restart) into dir, where redis-check-aof or a
// plain reader shows who wrote what, and when.
func (w *world) keepRedisData(dir string) {
	for i, srv := range w.topo.servers() {
		reply, err := srv.DoList("CONFIG", "GET", "dir")
		if err != nil || len(reply) != 2 {
			w.t.Logf("redis %d: CONFIG GET dir: %v %v", i, reply, err)
			continue
		}
		aofs, _ := filepath.Glob(filepath.Join(reply[1], "appendonlydir*"))
		to := filepath.Join(dir, fmt.Sprintf("%s-redis%d-%d-aof", w.cfg.topology, i, w.cfg.seed))
		for _, aof := range aofs {
			if err := os.CopyFS(filepath.Join(to, filepath.Base(aof)), os.DirFS(aof)); err != nil {
				w.t.Logf("redis %d: keep its AOF: %v", i, err)
			}
		}
		w.t.Logf("redis %d's AOFs: %s", i, to)
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func warnLines(path string, n int) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "===") || strings.Contains(l, "panic") {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = append([]string{fmt.Sprintf("… %d earlier lines", len(out)-n)}, out[len(out)-n:]...)
	}
	return strings.Join(out, "\n")
}
