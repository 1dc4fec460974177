package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"github.com/greendot/greendot/loadgen"
)

const benchUsage = `usage: greendot bench <scenario> [flags]

Drives running greendot nodes through the public protocol and prints a
table, then one JSON object, of what it measured. Scenarios:

  idle       N users connected, heartbeating as advertised: connect rate,
             server RSS per connection, CPU per connection-minute
  heartbeat  N connections at --rate heartbeats/s in total: CPU per heartbeat
  fanout     N viewers in one team, a subject comes and goes --rounds times:
             delivery latency p50/p99/max
  churn      N/2 users × 2 devices reconnect at random (--rate actions/s) for
             --duration: deliveries/s, CPU per 1,000, spurious deliveries
  expiry     half of N users freeze (TCP open, silent): offline lag past
             ttl + grace
  storm      all N connections cut at once, back within --window: time to
             settle, changes per viewer per subject, heartbeat ack p99
  largeteam  N members of one large team online, plus --offline-members
             who never connect (start the server with --large-team below
             N+101+offline), a viewer watching 50 of them: its connect and
             snapshot, team_counts, watch_result, then --rounds changes:
             latency, fan-out per change, heap per member
  abuse      hostile floods against one node, one after the other: CPU,
             peak RSS and a bystander's heartbeat ack p99 per flood
             (greendot bench abuse -h: its own flags)

idle and fanout take --protocol pusher: the same load over Pusher protocol 7
(greendot serve --pusher-app-id … --pusher-key K --pusher-secret S; give the
bench --pusher-key K --pusher-secret S), each socket subscribed to
presence-{team}; fanout then times member_added and member_removed.

Start the server first (greendot serve); give --grace its --offline-grace.

--peer drives another Pusher server the same way (idle and fanout with
--protocol pusher): no team setup, no /metrics; with --server-pid its CPU
and RSS come from /proc. --server-pid alone does the same for greendot.

flags:
`

// bench runs the load generator; see the loadgen package.
func bench(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "abuse" {
		return benchAbuse(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == abuseBystanderCmd {
		return benchAbuseBystander(args[1:], stderr)
	}
	var (
		o       loadgen.Options
		target  string
		targets string
		worker  string
	)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&target, "target", "ws://127.0.0.1:8080", "the node to drive")
	fs.StringVar(&targets, "targets", "", "several nodes, comma-separated (replaces --target)")
	fs.IntVar(&o.N, "n", 1000, "connections (churn: devices, 2 per user; fanout: viewers)")
	durationVar(fs, &o.Duration, "duration", 0, "the run's `duration`: idle hold 1m, heartbeat window 30s, churn time 1m; fanout: a bound")
	fs.IntVar(&o.Procs, "procs", 0, "load processes; 0 = one per 15,000 connections")
	fs.IntVar(&o.TeamSize, "team-size", 100, "users per team")
	fs.Float64Var(&o.Rate, "rate", 0, "heartbeat: heartbeats/s in total (default n); churn: actions/s (default users/15)")
	fs.IntVar(&o.Rounds, "rounds", 10, "fanout: times the subject comes and goes")
	fs.IntVar(&o.OfflineMembers, "offline-members", 0, "largeteam: members of the team who never connect, besides the n online")
	durationVar(fs, &o.Window, "window", 0, "the `duration` reconnects (storm) or freezes (expiry) are spread over (default 5s)")
	durationVar(fs, &o.Grace, "grace", 0, "the server's --offline-grace `duration` (default 5s)")
	fs.IntVar(&o.Samplers, "samplers", 20, "connections measuring heartbeat round trips (heartbeat, storm)")
	fs.IntVar(&o.ConnectConcurrency, "connect-concurrency", 128, "dials in flight per process")
	fs.IntVar(&o.SampleEvery, "sample-every", 0, "idle: one user in this many is a sampled viewer (the Go client, whose dots are checked after the hold), the others light sockets that heartbeat and read without decoding; 0: all full clients")
	fs.StringVar(&o.APIKey, "api-key", "", "the server's --api-key; or GREENDOT_API_KEY")
	fs.StringVar(&o.JWTSecret, "jwt-secret", "", "sign client tokens with the server's --jwt-secret; or GREENDOT_JWT_SECRET (unset: dev mode)")
	fs.StringVar(&o.RedisAddr, "redis-addr", "", "heartbeat: read this Redis's INFO cpu (host:port or redis://…)")
	fs.StringVar(&o.Protocol, "protocol", "native", "idle, fanout: what the connections speak, native (/v1/connect) or pusher (/app/{key}, presence-{team})")
	fs.StringVar(&o.PusherKey, "pusher-key", "", "--protocol pusher: the server's --pusher-key")
	fs.StringVar(&o.PusherSecret, "pusher-secret", "", "--protocol pusher: the server's --pusher-secret, to sign subscriptions; or GREENDOT_PUSHER_SECRET")
	fs.Var(pidList{&o.ServerPIDs}, "server-pid", "read the servers' CPU and RSS from /proc of these `pids` (comma-separated) instead of /metrics")
	fs.BoolVar(&o.Peer, "peer", false, "the target is another Pusher server, not greendot (with --protocol pusher): no team setup, no /metrics; see docs/benchmarks.md")
	fs.StringVar(&o.RunID, "run-id", "", "prefix of user and team ids (default random)")
	durationVar(fs, &o.MaxTime, "max-time", 0, "the `duration` bounding the whole run (default --duration + 10m)")
	quiet := fs.Bool("quiet", false, "no progress line on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write the load process's CPU profile to this file")
	memProfile := fs.String("memprofile", "", "on SIGUSR1, each load process writes its heap profile to this file (worker i: file.i)")
	fs.StringVar(&worker, "worker", "", "internal: serve as child worker i/n over stdin and stdout")

	scenario := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		scenario, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if scenario == "" && fs.NArg() > 0 {
		scenario = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	if scenario == "" {
		fs.Usage()
		return fmt.Errorf("bench: name a scenario: %s", strings.Join(loadgen.Scenarios(), ", "))
	}
	if o.APIKey == "" {
		o.APIKey = os.Getenv("GREENDOT_API_KEY")
	}
	if o.JWTSecret == "" {
		o.JWTSecret = os.Getenv("GREENDOT_JWT_SECRET")
	}
	if o.PusherSecret == "" {
		o.PusherSecret = os.Getenv("GREENDOT_PUSHER_SECRET")
	}
	o.Targets = []string{target}
	if targets != "" {
		o.Targets = strings.Split(targets, ",")
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if worker != "" {
		i, n, err := parseWorker(worker)
		if err != nil {
			return err
		}
		if *memProfile != "" {
			go heapOnSignal(ctx, fmt.Sprintf("%s.%d", *memProfile, i))
		}
		return loadgen.ServeWorker(ctx, scenario, o, i, n, os.Stdin, stdout)
	}
	if *memProfile != "" {
		go heapOnSignal(ctx, *memProfile)
	}
	if !*quiet {
		o.Progress = stderr
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	// Children get every flag given here, and their worker index and run id.
	childArgs := []string{"bench", scenario}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "worker" && f.Name != "run-id" {
			childArgs = append(childArgs, "--"+f.Name+"="+f.Value.String())
		}
	})
	o.Spawn = func(workerArgs []string) *exec.Cmd {
		cmd := exec.Command(exe, append(childArgs, workerArgs...)...)
		cmd.Stderr = stderr
		return cmd
	}
	res, err := loadgen.Run(ctx, scenario, o)
	if res != nil && len(res.Figures) > 0 {
		if werr := errors.Join(res.WriteTable(stdout), res.WriteJSON(stdout)); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

func parseWorker(s string) (int, int, error) {
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("bench: --worker %q must be i/n", s)
	}
	return i, n, nil
}

// pidList is a comma-separated list of process ids.
type pidList struct{ p *[]int }

func (l pidList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, v := range *l.p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l pidList) Set(v string) error {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not a process id", f)
		}
		out = append(out, n)
	}
	*l.p = out
	return nil
}

// heapOnSignal writes the process's heap profile to path at each SIGUSR1,
// until ctx ends: the load generator's own memory, read mid-run.
func heapOnSignal(ctx context.Context, path string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	defer signal.Stop(sig)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			f, err := os.Create(path)
			if err != nil {
				continue
			}
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
}
