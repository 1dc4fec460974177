// Package loadgen is greendot's load generator: it drives running greendot
// nodes through the public protocol only (WebSocket clients built on the Go
// client, the HTTP API for team membership, /metrics for the server's own
// RSS, heap and CPU) and measures the nodes against greendot's performance goals
// (docs/benchmarks.md).
//
// A run is one scenario (idle, heartbeat, fanout, churn, expiry, storm, largeteam). A
// driver runs the scenario's steps, scrapes the servers' metrics between
// them and builds the Result; the connections live in workers, each owning
// whole teams (so every viewer/subject pair is inside one worker). With one
// process the single worker runs in the driver's process; with Procs > 1
// every worker is a child process started through Options.Spawn that talks
// to the driver over its stdin and stdout, one JSON line per message, so a
// run can exceed what one process may hold open.
//
// Every loop is bounded in count and in time: a run ends by itself within
// Options.MaxTime whatever the servers do.
package loadgen

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// MaxConnsPerProcess is the most connections one load process holds: the
// machine allows 20,000 open files per process, and a process needs some
// for itself.
const MaxConnsPerProcess = 18000

// Options configures a run. The zero value of every field but Targets is a
// working default for the scenario (see Scenarios).
type Options struct {
	// Targets are the nodes' base URLs, ws://host:port (or wss://). Users
	// are spread over them round-robin; the HTTP API and /metrics are
	// reached at the same host. Default ws://127.0.0.1:8080.
	Targets []string
	// N is the number of connections: users (idle, heartbeat, expiry,
	// storm), devices (churn: N/2 users with 2 devices each) or viewers
	// (fanout). Default 1000.
	N int
	// Duration is the hold (idle), the measuring window (heartbeat) or the
	// churning time (churn); a bound on the rounds for fanout.
	Duration time.Duration
	// Procs is how many load processes hold the connections; 0 picks the
	// fewest that keep each under 15,000. Above 1 they are child processes.
	Procs int
	// TeamSize is the users per team; default 100.
	TeamSize int
	// Rate is heartbeats per second in total (heartbeat; default N, so one
	// per connection per second) or churn actions per second in total
	// (churn; default users/15).
	Rate float64
	// Rounds is how many times the fanout subject comes and goes; default 10.
	Rounds int
	// OfflineMembers (largeteam) are members of the team who never
	// connect: the team has N + 100 + OfflineMembers members, N online.
	OfflineMembers int
	// Window spreads the storm's reconnects and the expiry's freezes;
	// default 5s.
	Window time.Duration
	// Grace must be the servers' --offline-grace (the protocol does not
	// advertise it); default 5s.
	Grace time.Duration
	// Samplers are extra connections that measure heartbeat round trips
	// (heartbeat, storm); default 20.
	Samplers int
	// ConnectConcurrency bounds the dials in flight per process; default 128.
	ConnectConcurrency int
	// SampleEvery (idle, native), if above 0, makes one user in SampleEvery
	// a sampled viewer (the Go client, keeping presence) and the others
	// light sockets (light.go): heartbeats and reads only, so that the load
	// processes of a large run do not starve themselves. 0: every user is a
	// full client.
	SampleEvery int
	// APIKey is the servers' --api-key, if they have one.
	APIKey string
	// JWTSecret, if set, signs a token per user; else users connect with
	// ?user= (dev mode).
	JWTSecret string
	// RedisAddr (host:port or redis://[user:pass@]host:port), if set, is
	// asked INFO cpu before and after the heartbeat window.
	RedisAddr string
	// Protocol is what the run's connections speak: "native" (/v1/connect,
	// the default) or "pusher" (Pusher protocol 7 at /app/{key}, each
	// socket subscribed to presence-{team}); "pusher" for idle and fanout
	// only.
	Protocol string
	// PusherKey and PusherSecret are the servers' --pusher-key and
	// --pusher-secret, for Protocol "pusher": the secret signs each
	// presence subscription as an app's auth endpoint would.
	PusherKey, PusherSecret string
	// ServerPIDs, if set, are the local processes of the servers: their
	// CPU and RSS are read from /proc instead of /metrics.
	ServerPIDs []int
	// Peer says the targets are not greendot but another Pusher server
	// (Protocol "pusher", idle and fanout): no /healthz, no team setup
	// through the HTTP API (subscribing to presence-{team} is membership),
	// no /metrics. Connections are counted at the load generator, and the
	// figures only greendot's metrics give are left out; CPU and RSS need
	// ServerPIDs.
	Peer bool
	// RunID prefixes every user and team id, so runs never meet; random
	// when empty.
	RunID string
	// MaxTime bounds the whole run; default Duration + 10m.
	MaxTime time.Duration
	// Progress receives a progress line while the run goes; nil for none.
	Progress io.Writer
	// Spawn makes the command of one child worker; the child must call
	// ServeWorker with the same Options and the given extra arguments
	// parsed (see cmd/greendot). Required when Procs > 1.
	Spawn func(workerArgs []string) *exec.Cmd

	// pipeWorkers, in tests, runs "remote" workers in goroutines over pipes.
	pipeWorkers bool
}

// Scenarios lists the scenario names, in the order docs/benchmarks.md gives them.
func Scenarios() []string {
	return []string{"idle", "heartbeat", "fanout", "churn", "expiry", "storm", "largeteam"}
}

// withDefaults fills in defaults and checks o for scenario.
func (o Options) withDefaults(scenario string) (Options, error) {
	if !slices.Contains(Scenarios(), scenario) {
		return o, fmt.Errorf("loadgen: unknown scenario %q (one of %s)", scenario, strings.Join(Scenarios(), ", "))
	}
	o.Targets = slices.Clone(o.Targets) // normalised below: never the caller's array
	if len(o.Targets) == 0 {
		o.Targets = []string{"ws://127.0.0.1:8080"}
	}
	for i, t := range o.Targets {
		u, err := url.Parse(t)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			return o, fmt.Errorf("loadgen: target %q must be ws://host:port or wss://host:port", t)
		}
		o.Targets[i] = strings.TrimSuffix(u.Scheme+"://"+u.Host+strings.TrimSuffix(u.Path, "/v1/connect"), "/")
	}
	if o.N == 0 {
		o.N = 1000
	}
	if o.TeamSize == 0 {
		o.TeamSize = 100
	}
	if o.Window == 0 {
		o.Window = 5 * time.Second
	}
	if o.Grace == 0 {
		o.Grace = 5 * time.Second
	}
	if o.Samplers == 0 {
		o.Samplers = 20
	}
	if o.ConnectConcurrency == 0 {
		o.ConnectConcurrency = 128
	}
	if o.Rounds == 0 {
		o.Rounds = 10
	}
	if o.Protocol == "" {
		o.Protocol = protoNative
	}
	switch scenario {
	case "idle":
		setDur(&o.Duration, time.Minute)
	case "heartbeat":
		setDur(&o.Duration, 30*time.Second)
		if o.Rate == 0 {
			o.Rate = float64(o.N)
		}
	case "churn":
		setDur(&o.Duration, time.Minute)
		if o.Rate == 0 {
			o.Rate = max(1, float64(o.N/2)/15)
		}
	}
	if o.MaxTime == 0 {
		o.MaxTime = o.Duration + 10*time.Minute
	}
	if o.RunID == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		o.RunID = "b" + hex.EncodeToString(b)
	}
	switch {
	case o.N < 1 || o.TeamSize < 2:
		return o, errors.New("loadgen: --n must be at least 1 and --team-size at least 2")
	case scenario == "churn" && o.N < 4:
		return o, errors.New("loadgen: churn needs --n of at least 4 (2 devices per user)")
	case scenario == "expiry" && o.N < 2:
		return o, errors.New("loadgen: expiry needs --n of at least 2 (a viewer and a subject)")
	case o.Duration < 0 || o.Window < 0 || o.Grace < 0 || o.Rate < 0 || o.Procs < 0 || o.Samplers < 0 || o.OfflineMembers < 0:
		return o, errors.New("loadgen: durations, rates and counts must not be negative")
	case scenario == "heartbeat" && o.Rate/float64(o.N) > 15:
		// The server refuses more than 20 frames/s per connection.
		return o, fmt.Errorf("loadgen: %.0f heartbeats/s over %d connections is above 15/s each; use more connections", o.Rate, o.N)
	case o.Protocol != protoNative && o.Protocol != protoPusher:
		return o, fmt.Errorf("loadgen: protocol %q must be native or pusher", o.Protocol)
	case o.Protocol == protoPusher && scenario != "idle" && scenario != "fanout":
		return o, fmt.Errorf("loadgen: --protocol pusher runs idle and fanout only, not %s", scenario)
	case o.Protocol == protoPusher && (o.PusherKey == "" || o.PusherSecret == ""):
		return o, errors.New("loadgen: --protocol pusher needs the servers' --pusher-key and --pusher-secret")
	case o.Peer && o.Protocol != protoPusher:
		return o, errors.New("loadgen: --peer needs --protocol pusher: a peer speaks no greendot protocol")
	case slices.ContainsFunc(o.ServerPIDs, func(p int) bool { return p <= 0 }):
		return o, errors.New("loadgen: --server-pid must be process ids above 0")
	case o.SampleEvery < 0:
		return o, errors.New("loadgen: --sample-every must not be negative")
	case o.SampleEvery > 0 && (scenario != "idle" || o.Protocol != protoNative):
		return o, errors.New("loadgen: --sample-every is for idle over the native protocol")
	case o.OfflineMembers > 0 && scenario != "largeteam":
		return o, fmt.Errorf("loadgen: --offline-members is for largeteam, not %s", scenario)
	case !protocolID(o.RunID):
		return o, fmt.Errorf("loadgen: run id %q must be 1-32 letters, digits, '-' or '_'", o.RunID)
	}
	if o.Procs == 0 {
		o.Procs = (o.N + 14999) / 15000
	}
	if per := (o.N + o.Procs - 1) / o.Procs; per > MaxConnsPerProcess {
		return o, fmt.Errorf("loadgen: %d connections per process is above %d (the open-file limit); use --procs %d or more",
			per, MaxConnsPerProcess, (o.N+MaxConnsPerProcess-1)/MaxConnsPerProcess)
	}
	return o, nil
}

func setDur(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

func protocolID(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Ids of the run's users and teams.
func (o *Options) user(i int) string { return fmt.Sprintf("%s-u%d", o.RunID, i) }
func (o *Options) team(k int) string { return fmt.Sprintf("%s-t%d", o.RunID, k) }

// teamOf is the team index of user i.
func (o *Options) teamOf(i int) int { return i / o.TeamSize }

// ownsTeam says whether worker w of count holds team k: teams are dealt
// round-robin, so viewers and subjects of one team share a worker.
func ownsTeam(k, w, count int) bool { return k%count == w }

// httpBase turns a ws:// target into the http:// base of the same node.
func httpBase(target string) string {
	switch {
	case strings.HasPrefix(target, "wss://"):
		return "https://" + strings.TrimPrefix(target, "wss://")
	case strings.HasPrefix(target, "ws://"):
		return "http://" + strings.TrimPrefix(target, "ws://")
	}
	return target
}
