package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/client"
)

// TestChaosOracle feeds the oracle hand-made histories, so that it is known
// to catch what it claims to catch and to pass what is right.
func TestChaosOracle(t *testing.T) {
	s := func(d float64) time.Duration { return time.Duration(d * float64(time.Second)) }
	type change struct {
		at, recv float64 // seconds from the start; at 0: none (a snapshot)
		user     string
		state    string
		prev     string
		version  uint64
	}
	type wire struct {
		recv     float64
		snapshot bool
		user     string
		state    string
		version  uint64
	}
	type sess struct {
		from, to float64 // to 0: open
		node     string
		kind     string
	}
	type fault struct {
		kind     string
		node     string
		from, to float64
	}
	type span struct {
		team, user string
		from, to   float64 // to 0: open
	}
	type hist struct {
		statuses     [][2]any        // u01's device's status changes (time, state)
		wireAt       map[int]float64 // the "at" of wire entries, by index
		second       []sess          // u01's second device
		secondAway   bool            // idle from the start
		frozen2      [][2]float64    // when the second one was frozen
		members      []span          // replace the viewer's membership
		viewerFrozen [][2]float64    // when the viewer was frozen
		dialed       float64         // when the viewer dialed its connection; 0: -5.1
		subject      []sess          // u01's device
		dialFor      float64         // how long each of its connect attempts took; 0: 50 ms
		frozen       [][2]float64    // and when it was frozen
		changes      []change
		wire         []wire
		faults       []fault
		want         map[string]int // figures that must be this (0: must be absent)
		topology     string         // "cluster"; default one Redis
		refused      []sess         // u01's device's connect attempts refused (from, to, node)
		restarted    float64        // when the first fault's node was started again; 0: not known
	}
	online := func(recv float64) change {
		return change{recv: recv, user: "u01", state: "online", version: 1}
	}
	cases := map[string]hist{
		"a clean close, the offline after the grace": {
			subject: []sess{{0, 10, "b", "closed"}},
			changes: []change{online(0.1), {11.5, 11.6, "u01", "offline", "online", 2}},
			wire:    []wire{{0.1, true, "u01", "online", 1}, {11.6, false, "u01", "offline", 2}},
			want:    map[string]int{"false offline": 0, "ghost": 0, "doubled": 0, "out of order": 0, "visibility": 0, "spurious": 0},
		},
		"no offline ever comes: a ghost": {
			subject: []sess{{0, 10, "b", "closed"}},
			changes: []change{online(0.1)},
			want:    map[string]int{"ghost": 1},
		},
		"an offline while the device is live": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1), {5, 5.1, "u01", "offline", "online", 2}},
			want:    map[string]int{"false offline": 1},
		},
		"an offline before the grace is over": {
			subject: []sess{{0, 10, "b", "closed"}},
			changes: []change{online(0.1), {10.5, 10.6, "u01", "offline", "online", 2}},
			want:    map[string]int{"false offline": 1},
		},
		"a reconnect within the grace, shown online throughout": {
			subject: []sess{{0, 10, "b", "blip"}, {10.8, 0, "a", ""}},
			changes: []change{online(0.1)},
			want:    map[string]int{"false offline": 0, "ghost": 0, "missed online episodes": 0},
		},
		"a reconnect within the grace, yet an offline": {
			subject: []sess{{0, 10, "b", "blip"}, {10.8, 0, "a", ""}},
			changes: []change{online(0.1), {11.2, 11.3, "u01", "offline", "online", 2}},
			want:    map[string]int{"false offline": 1},
		},
		"the offline twice": {
			subject: []sess{{0, 10, "b", "closed"}},
			changes: []change{online(0.1), {11.5, 11.6, "u01", "offline", "online", 2}, {12, 12.1, "u01", "offline", "offline", 3}},
			want:    map[string]int{"doubled": 1},
		},
		// The viewer, frozen, reads at the thaw what was sent in the
		// recovery after a partition of its node (until 4 + 5 + 3 s).
		"an offline restated in a recovery, read after it": {
			subject:      []sess{{0, 5, "b", "closed"}},
			viewerFrozen: [][2]float64{{10.8, 13}},
			faults:       []fault{{"partition 2s", "a", 2, 4}},
			changes:      []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {11.5, 13, "u01", "offline", "offline", 3}},
			want:         map[string]int{"doubled": 0},
		},
		"an offline restated after the recovery": {
			subject:      []sess{{0, 5, "b", "closed"}},
			viewerFrozen: [][2]float64{{10.8, 13}},
			faults:       []fault{{"partition 2s", "a", 2, 4}},
			changes:      []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {12.5, 13, "u01", "offline", "offline", 3}},
			want:         map[string]int{"doubled": 1},
		},
		// A node killed makes every node resync when it is found dead
		// (2 to 4 s after the kill: its liveness after its last beat, a
		// sweep, a health check; until 7 s with the 3 s margin), and when
		// it restarts under its id (until 3 s after).
		"an offline restated in the resync after a node was found dead": {
			subject: []sess{{0, 5, "b", "closed"}},
			faults:  []fault{{"kill -9", "c", 9, 10}},
			changes: []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {15.8, 15.9, "u01", "offline", "offline", 3}},
			want:    map[string]int{"doubled": 0},
		},
		"an offline restated in the resync after a node's restart": {
			subject: []sess{{0, 5, "b", "closed"}},
			faults:  []fault{{"kill -9", "c", 9, 22}},
			changes: []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {24.8, 24.9, "u01", "offline", "offline", 3}},
			want:    map[string]int{"doubled": 0},
		},
		"an offline restated after a node was killed, before it could be found dead": {
			subject: []sess{{0, 5, "b", "closed"}},
			faults:  []fault{{"kill -9", "c", 9, 22}},
			changes: []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {10.5, 10.6, "u01", "offline", "offline", 3}},
			want:    map[string]int{"doubled": 1},
		},
		"an offline restated after the resyncs of a node killed": {
			subject: []sess{{0, 5, "b", "closed"}},
			faults:  []fault{{"kill -9", "c", 9, 10}},
			changes: []change{online(0.1), {6.5, 6.6, "u01", "offline", "online", 2}, {16.5, 16.6, "u01", "offline", "offline", 3}},
			want:    map[string]int{"doubled": 1},
		},
		"versions going back on a connection": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 5}, {3, false, "u01", "online", 4}},
			want:    map[string]int{"out of order": 1},
		},
		// A node cut off from Redis past its liveness is found dead as a
		// killed one is, and every node resyncs then (chaos seed
		// 618395093); cut off for less, it is not.
		"the same version twice in the resync after another node was cut off": {
			subject: []sess{{0, 0, "b", ""}},
			faults:  []fault{{"partition 7s", "c", 9, 16}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 5}, {13, false, "u01", "online", 5}},
			want:    map[string]int{"resent": 0},
		},
		"the same version twice after another node was cut off briefly": {
			subject: []sess{{0, 0, "b", ""}},
			faults:  []fault{{"partition 1.5s", "c", 9, 10.5}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 5}, {13, false, "u01", "online", 5}},
			want:    map[string]int{"resent": 1},
		},
		// A node killed and started again tells every node to resync at its
		// new process's first beat, before it answers (chaos seed
		// 621771424: the resend came 10 ms before the fault's end); a
		// resend in that resync is a recovery's.
		"the same version twice as a killed node starts again": {
			subject:   []sess{{0, 0, "b", ""}},
			faults:    []fault{{"kill -9", "c", 2, 12.07}},
			restarted: 12.01,
			changes:   []change{online(0.1)},
			wire:      []wire{{0.1, true, "u01", "online", 5}, {12.06, false, "u01", "online", 5}},
			want:      map[string]int{"resent": 0},
		},
		"the same version twice before a killed node starts again": {
			subject:   []sess{{0, 0, "b", ""}},
			faults:    []fault{{"kill -9", "c", 2, 12.07}},
			restarted: 12.01,
			changes:   []change{online(0.1)},
			wire:      []wire{{0.1, true, "u01", "online", 5}, {11.9, false, "u01", "online", 5}},
			want:      map[string]int{"resent": 1},
		},
		"the same version twice, outside any recovery": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 5}, {13, false, "u01", "online", 5}},
			want:    map[string]int{"resent": 1},
		},
		"a user who shares no team": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 1}, {4, false, "u02", "online", 1}},
			want:    map[string]int{"visibility": 1},
		},
		"sent before a removal, read after a freeze": {
			subject:      []sess{{0, 0, "b", ""}},
			changes:      []change{online(0.1)},
			wire:         []wire{{0.1, true, "u01", "online", 1}, {8, false, "u01", "away", 2}},
			members:      []span{{"t0", "u00", -10, 5}},
			viewerFrozen: [][2]float64{{4, 8}},
			want:         map[string]int{"visibility": 0},
		},
		"published before a removal, held by a partition": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 1}, {8, false, "u01", "away", 2}},
			wireAt:  map[int]float64{1: 4.5},
			members: []span{{"t0", "u00", -10, 5}},
			want:    map[string]int{"visibility": 0},
		},
		"sent after a removal": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 1}, {8, false, "u01", "away", 2}},
			members: []span{{"t0", "u00", -10, 5}},
			want:    map[string]int{"visibility": 1},
		},
		// The viewer's node was cut off as the viewer was removed; a change
		// made after it reaches the node at the heal with the removal. On
		// one Redis both come on one connection, in order; on a cluster
		// they come from two masters in no set order (finding 21).
		"a change made after a removal, read at the heal (one Redis)": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{0.1, true, "u01", "online", 1}, {6.95, false, "u01", "away", 2}},
			wireAt:  map[int]float64{1: 6},
			members: []span{{"t0", "u00", -10, 5}},
			faults:  []fault{{"partition 2s", "a", 4.9, 6.9}},
			want:    map[string]int{"visibility": 1, "visibility at a heal (cluster)": 0},
		},
		"a change made after a removal, read at the heal (cluster)": {
			subject:  []sess{{0, 0, "b", ""}},
			changes:  []change{online(0.1)},
			wire:     []wire{{0.1, true, "u01", "online", 1}, {6.95, false, "u01", "away", 2}},
			wireAt:   map[int]float64{1: 6},
			members:  []span{{"t0", "u00", -10, 5}},
			faults:   []fault{{"partition 2s", "a", 4.9, 6.9}},
			topology: "cluster",
			want:     map[string]int{"visibility": 0, "visibility at a heal (cluster)": 1},
		},
		"a change made after a removal, read a while after the heal (cluster)": {
			subject:  []sess{{0, 0, "b", ""}},
			changes:  []change{online(0.1)},
			wire:     []wire{{0.1, true, "u01", "online", 1}, {8.5, false, "u01", "away", 2}},
			wireAt:   map[int]float64{1: 8.4},
			members:  []span{{"t0", "u00", -10, 5}},
			faults:   []fault{{"partition 2s", "a", 4.9, 6.9}},
			topology: "cluster",
			want:     map[string]int{"visibility": 1},
		},
		// The device, away, tried node c while c was cut off, was refused
		// and gave up; c had registered it, written at the heal (online,
		// as a new connection is), and its end only later (chaos seed
		// 372444857: 6 spurious).
		"a refused connect to a node cut off is written at the heal": {
			subject:  []sess{{0, 8, "b", "blip"}},
			statuses: [][2]any{{5.4, "away"}},
			refused:  []sess{{8.3, 8.34, "c", ""}},
			faults:   []fault{{"partition 6.6s", "c", 3.35, 9.96}},
			changes:  []change{online(0.1), {5.5, 5.5, "u01", "away", "online", 2}, {9.6, 9.6, "u01", "offline", "away", 3}, {10.64, 10.64, "u01", "online", "offline", 4}, {0, 12.05, "u01", "online", "offline", 4}, {14.5, 14.5, "u01", "offline", "online", 5}},
			want:     map[string]int{"spurious": 0},
		},
		"a refused connect to a node not cut off is not": {
			subject:  []sess{{0, 8, "b", "blip"}},
			statuses: [][2]any{{5.4, "away"}},
			refused:  []sess{{8.3, 8.34, "c", ""}},
			changes:  []change{online(0.1), {5.5, 5.5, "u01", "away", "online", 2}, {9.6, 9.6, "u01", "offline", "away", 3}, {10.64, 10.64, "u01", "online", "offline", 4}, {14.5, 14.5, "u01", "offline", "online", 5}},
			want:     map[string]int{"spurious": 1},
		},
		"the viewer itself": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1)},
			wire:    []wire{{4, false, "u00", "online", 1}},
			want:    map[string]int{"self": 1},
		},
		"away shown while the device is online": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1), {5, 5.1, "u01", "away", "online", 2}},
			want:    map[string]int{"spurious": 1, "wrong status episodes": 1},
		},
		"a freeze long enough to be reaped, then a thaw": {
			subject: []sess{{0, 8.1, "b", "lost"}},
			frozen:  [][2]float64{{5, 8}},
			changes: []change{online(0.1), {9.5, 9.6, "u01", "offline", "online", 2}},
			want:    map[string]int{"false offline": 0, "ghost": 0},
		},
		// Chaos, one Redis, seed 800521752: an away device reconnected and
		// froze at once, before it could say away again; the new
		// connection showed online until it was reaped and its grace ended.
		"an away device frozen as it reconnects shows online until reaped": {
			subject:  []sess{{0, 5, "b", "closed"}, {6, 9.1, "c", "lost"}},
			statuses: [][2]any{{2.0, "away"}},
			frozen:   [][2]float64{{5.98, 12}},
			changes:  []change{online(0.1), {2.1, 2.1, "u01", "away", "online", 2}, {0, 10.2, "u01", "online", "away", 3}, {10.6, 10.6, "u01", "offline", "online", 4}},
			want:     map[string]int{"spurious": 0},
		},
		"an away device frozen long after it reconnected: online later is spurious": {
			subject:  []sess{{0, 5, "b", "closed"}, {6, 9.1, "c", "lost"}},
			statuses: [][2]any{{2.0, "away"}},
			frozen:   [][2]float64{{7.5, 12}},
			changes:  []change{online(0.1), {2.1, 2.1, "u01", "away", "online", 2}, {0, 10.2, "u01", "online", "away", 3}, {10.6, 10.6, "u01", "offline", "online", 4}},
			want:     map[string]int{"spurious": 1},
		},
		"a short freeze: the connection lives on": {
			subject: []sess{{0, 0, "b", ""}},
			frozen:  [][2]float64{{5, 5.5}},
			changes: []change{online(0.1), {9.5, 9.6, "u01", "offline", "online", 2}},
			want:    map[string]int{"false offline": 1},
		},
		"away while an online device may be gone": {
			subject:    []sess{{0, 10, "b", "blip"}, {10.3, 0, "a", ""}},
			second:     []sess{{0, 0, "b", ""}},
			secondAway: true,
			frozen2:    [][2]float64{{9, 20}},
			changes:    []change{online(0.1), {10.1, 10.2, "u01", "away", "online", 2}},
			want:       map[string]int{"spurious": 0},
		},
		"a killed node's connection lingers with its own status": {
			subject:  []sess{{0, 5, "a", "node killed"}, {5.5, 6, "b", "closed"}},
			statuses: [][2]any{{5.6, "away"}},
			changes:  []change{online(0.1), {6.2, 6.2, "u01", "away", "online", 2}, {9, 9, "u01", "online", "away", 3}},
			want:     map[string]int{"spurious": 0},
		},
		// The device was set away as its node was killed (chaos, one
		// Redis, seed 8888206): the node may have died before writing it,
		// so its connection lingers online until the node's release, and a
		// snapshot read after the device closed elsewhere shows it online.
		"a status set as its node was killed: the connection lingers with the one before": {
			subject:  []sess{{0, 5, "a", "node killed"}, {5.3, 7, "b", "closed"}},
			statuses: [][2]any{{5.0, "away"}},
			changes:  []change{online(0.1), {5.4, 5.4, "u01", "away", "online", 2}, {0, 9.3, "u01", "online", "away", 1}, {11.2, 11.2, "u01", "offline", "online", 3}},
			want:     map[string]int{"spurious": 0, "ghost": 0, "false offline": 0},
		},
		"a status set a second before its node was killed: online after the close is spurious": {
			subject:  []sess{{0, 5, "a", "node killed"}, {5.3, 7, "b", "closed"}},
			statuses: [][2]any{{4.0, "away"}},
			changes:  []change{online(0.1), {4.1, 4.1, "u01", "away", "online", 2}, {0, 9.3, "u01", "online", "away", 1}, {11.2, 11.2, "u01", "offline", "online", 3}},
			want:     map[string]int{"spurious": 1},
		},
		// The harness closed d3 on b 10 ms before it killed b: b may never
		// have told Redis, so the idle connection lingers until b's is
		// released, and d2's blip shows the user away meanwhile.
		"a close its node died before telling lingers until the node's release": {
			subject:    []sess{{0, 12.74, "c", "blip"}, {12.96, 0, "a", ""}},
			second:     []sess{{0, 10, "b", "closed"}},
			secondAway: true,
			faults:     []fault{{"kill -9", "b", 10.01, 12.8}},
			changes:    []change{online(0.1), {12.75, 12.76, "u01", "away", "online", 2}, {12.97, 12.98, "u01", "online", "away", 3}},
			want:       map[string]int{"spurious": 0},
		},
		// The device went idle while its reconnect took 6 s (a slow
		// node, a frozen client): the node registered it as a new
		// connection does, online, and its client could say away only once
		// welcomed (chaos, cluster, seed 7120261: u13 online in snapshots
		// for 2.4 s of such an attempt).
		"a device that went idle during a slow reconnect shows online until welcomed": {
			subject:  []sess{{0, 2.4, "c", "blip"}, {8.5, 0, "a", ""}},
			dialFor:  6,
			statuses: [][2]any{{3.0, "away"}},
			changes:  []change{online(0.1), {4.0, 4.1, "u01", "offline", "online", 2}, {6.5, 6.6, "u01", "online", "offline", 3}, {8.6, 8.7, "u01", "away", "online", 4}},
			want:     map[string]int{"spurious": 0},
		},
		"a device idle when welcomed: online a while later is spurious": {
			subject:  []sess{{0, 2.4, "c", "blip"}, {8.5, 0, "a", ""}},
			dialFor:  6,
			statuses: [][2]any{{3.0, "away"}},
			changes:  []change{online(0.1), {4.0, 4.1, "u01", "offline", "online", 2}, {11.0, 11.1, "u01", "online", "offline", 3}, {11.2, 11.3, "u01", "away", "online", 4}},
			want:     map[string]int{"spurious": 1},
		},
		"a close its node outlived: away long after it is spurious": {
			subject:    []sess{{0, 12.74, "c", "blip"}, {12.96, 0, "a", ""}},
			second:     []sess{{0, 10, "b", "closed"}},
			secondAway: true,
			changes:    []change{online(0.1), {12.75, 12.76, "u01", "away", "online", 2}, {12.97, 12.98, "u01", "online", "away", 3}},
			want:       map[string]int{"spurious": 1},
		},
		"a snapshot read while the viewer's join was in flight leaves the subject out": {
			subject: []sess{{0, 0, "b", ""}},
			members: []span{{"t0", "u00", 6, 0}},
			dialed:  5.5,
			changes: []change{{0, 7.5, "u01", "offline", "online", 1}, {7.6, 7.6, "u01", "online", "offline", 2}},
			want:    map[string]int{"false offline": 0},
		},
		"a snapshot read after the viewer's join leaves the subject out": {
			subject: []sess{{0, 0, "b", ""}},
			members: []span{{"t0", "u00", 5, 0}},
			dialed:  5.5,
			changes: []change{{0, 7.5, "u01", "offline", "online", 1}, {7.6, 7.6, "u01", "online", "offline", 2}},
			want:    map[string]int{"false offline": 1},
		},
		"released by the others while its node is cut off": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1), {7.6, 7.7, "u01", "offline", "online", 2}, {9.6, 9.7, "u01", "online", "offline", 3}},
			faults:  []fault{{"partition 7s", "b", 2, 9}},
			want:    map[string]int{"false offline": 0, "released (node cut off)": 1, "missed online episodes": 0},
		},
		"an offline in a short partition is false": {
			subject: []sess{{0, 0, "b", ""}},
			changes: []change{online(0.1), {3, 3.1, "u01", "offline", "online", 2}, {4.6, 4.7, "u01", "online", "offline", 3}},
			faults:  []fault{{"partition 1.5s", "b", 2, 3.5}},
			want:    map[string]int{"false offline": 1},
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			base := time.Now().Add(-time.Minute)
			at := func(x float64) time.Time { return base.Add(s(x)) }
			w := &world{t: t, cfg: chaosConfig{topology: h.topology, users: 3, teams: 2, tm: timing{ttl: 3 * time.Second, heartbeat: time.Second, grace: 1500 * time.Millisecond}},
				start: base, end: at(30), counts: map[string]int{}}
			w.spans = []*memberSpan{
				{team: "t0", user: "u00", interval: interval{from: at(-10)}, joined: at(-10)},
				{team: "t0", user: "u01", interval: interval{from: at(-10)}, joined: at(-10)},
				{team: "t1", user: "u02", interval: interval{from: at(-10)}, joined: at(-10)},
			}
			if len(h.members) > 0 {
				w.spans = w.spans[1:]
				for _, m := range h.members {
					sp := &memberSpan{team: m.team, user: m.user, interval: interval{from: at(m.from)}, joined: at(m.from)}
					if m.to != 0 {
						sp.to, sp.leaving = at(m.to), at(m.to)
					}
					w.spans = append(w.spans, sp)
				}
			}
			for i, f := range h.faults {
				fw := &faultWindow{kind: f.kind, node: f.node, interval: interval{from: at(f.from), to: at(f.to)}}
				if i == 0 && h.restarted != 0 {
					fw.started = at(h.restarted)
				}
				w.faults = append(w.faults, fw)
			}
			viewer := &device{w: w, id: 1, user: "u00", name: "d1"}
			viewer.sessions = []*session{{start: at(-5), node: "a"}}
			rc := &rawConn{node: "a", dialed: at(-5.1)}
			if h.dialed != 0 {
				rc.dialed = at(h.dialed)
			}
			for i, e := range h.wire {
				we := wireEntry{recv: at(e.recv), snapshot: e.snapshot, user: e.user, state: e.state, version: e.version}
				if x, ok := h.wireAt[i]; ok {
					we.at = at(x).UnixMilli()
				}
				rc.entries = append(rc.entries, we)
			}
			viewer.raws = []*rawConn{rc}
			for _, f := range h.viewerFrozen {
				viewer.freezes = append(viewer.freezes, interval{from: at(f[0]), to: at(f[1])})
			}
			for _, c := range h.changes {
				ch := client.Change{UserID: c.user, State: c.state, Previous: c.prev, Version: c.version, Received: at(c.recv), FromSnapshot: c.at == 0}
				if c.at != 0 {
					ch.At = at(c.at)
				}
				viewer.changes = append(viewer.changes, ch)
			}
			subject := &device{w: w, id: 2, user: "u01", name: "d2"}
			for _, ss := range h.subject {
				se := &session{start: at(ss.from), node: ss.node, endKind: ss.kind}
				if ss.to != 0 {
					se.end = at(ss.to)
				}
				subject.sessions = append(subject.sessions, se)
				dial := 0.05
				if h.dialFor != 0 {
					dial = h.dialFor
				}
				subject.attempts = append(subject.attempts, &attempt{from: at(ss.from - dial), to: at(ss.from), node: ss.node, ok: true})
			}
			for _, r := range h.refused {
				subject.attempts = append(subject.attempts, &attempt{from: at(r.from), to: at(r.to), node: r.node})
			}
			for _, st := range h.statuses {
				subject.statuses = append(subject.statuses, statusChange{at: at(st[0].(float64)), state: st[1].(string)})
			}
			for _, f := range h.frozen {
				subject.freezes = append(subject.freezes, interval{from: at(f[0]), to: at(f[1])})
			}
			var extra []*device
			if len(h.second) > 0 {
				d3 := &device{w: w, id: 3, user: "u01", name: "d3"}
				for _, ss := range h.second {
					se := &session{start: at(ss.from), node: ss.node, endKind: ss.kind}
					if ss.to != 0 {
						se.end = at(ss.to)
					}
					d3.sessions = append(d3.sessions, se)
				}
				if h.secondAway {
					d3.statuses = []statusChange{{at: at(-1), state: "away"}}
				}
				for _, f := range h.frozen2 {
					d3.freezes = append(d3.freezes, interval{from: at(f[0]), to: at(f[1])})
				}
				d3.changes = []client.Change{{UserID: "u00", State: "online", Version: 1, Received: at(h.second[0].from), FromSnapshot: true}}
				extra = append(extra, d3)
			}
			// The subject sees the viewer, which is online throughout.
			subject.changes = []client.Change{{UserID: "u00", State: "online", Version: 1, Received: at(h.subject[0].from), FromSnapshot: true}}
			w.devices = append([]*device{viewer, subject}, extra...)
			o := newOracle(w, at(0), at(30))
			o.judgeChanges()
			o.judgeFrames()
			o.judgeScreens()
			for fig, want := range h.want {
				if got := o.fig[fig]; got != want {
					t.Errorf("%s = %d, want %d; figures %v; violations %v", fig, got, want, o.fig, fmt.Sprint(o.violations))
				}
			}
		})
	}
}
