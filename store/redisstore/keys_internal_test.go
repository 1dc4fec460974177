package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/store/storetest"
)

// foundKinds are the keys sweep, reconcile and forget may reach without
// declaring them: those of the users and nodes they find in their shard
// (found_user, found_nc in prelude.lua), always under the shard's hash tag.
var foundKinds = map[string][]string{
	"sweep":     {"u:", "uc:", "sv:", "ut:", "nc:"},
	"reconcile": {"u:", "uc:", "sv:", "ut:", "nc:"},
	"forget":    {"u:", "uc:", "sv:"},
}

// keyGuard makes Redis refuse every key a script call did not declare.
// Redis checks each command a script runs against the ACL of the user who
// called it, so before each call the guard sets the store's user's key
// patterns to exactly the keys the call declares (and, for the scripts of
// foundKinds, those kinds under the call's shard prefix); any other command
// may touch any key. Calls run one at a time. A refusal is recorded even
// where the store swallows the error (background loops).
type keyGuard struct {
	admin *redis.Client
	names map[string]string // sha1 or source → script name

	mu  sync.Mutex
	cur string // the key rules in force

	vmu        sync.Mutex
	violations []string
}

const guardUser, guardPass = "scripts", "scripts-pw"

func newKeyGuard(t *testing.T, r *redistest.Server, sc scripts) *keyGuard {
	t.Helper()
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	err := admin.Do(context.Background(), "ACL", "SETUSER", guardUser, "reset", "on", ">"+guardPass,
		"allcommands", "allchannels", "allkeys").Err()
	if err != nil {
		t.Fatal(err)
	}
	g := &keyGuard{admin: admin, names: make(map[string]string), cur: "allkeys"}
	for name, s := range map[string]*redis.Script{
		"connect": sc.connect, "heartbeat": sc.heartbeat, "status": sc.status, "disconnect": sc.disconnect,
		"sweep": sc.sweep, "beat": sc.beat, "presence": sc.presence, "reconcile": sc.reconcile,
		"floor": sc.floor, "forget": sc.forget, "member_user": sc.memberUser, "member_team": sc.memberTeam,
		"member_read": sc.memberRead,
		"user_status": sc.userStatus, "px_set": sc.pxSet, "px_live": sc.pxLive, "px_drop": sc.pxDrop,
		"occupancy": sc.occupancy, "px_info": sc.pxInfo,
	} {
		g.names[s.Hash()] = name
	}
	return g
}

// url is the store's URL, as the guarded user.
func (g *keyGuard) url(r *redistest.Server) string {
	return "redis://" + guardUser + ":" + guardPass + "@" + r.Addr()
}

var globChars = regexp.MustCompile(`[*?\[\]\\]`)

// rules are the ACL key rules for cmd, and the script it runs ("" if none).
func (g *keyGuard) rules(cmd redis.Cmder) (string, []string) {
	args := cmd.Args()
	switch cmd.Name() {
	case "eval", "evalsha":
	default:
		return "", []string{"allkeys"}
	}
	name := g.names[fmt.Sprint(args[1])]
	if cmd.Name() == "eval" {
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		name = g.names[hex.EncodeToString(sum[:])]
	}
	n := 0
	fmt.Sscan(fmt.Sprint(args[2]), &n)
	rules := []string{"resetkeys"}
	for _, k := range args[3 : 3+n] {
		rules = append(rules, "~"+globChars.ReplaceAllString(argString(k), `\$0`))
	}
	if kinds := foundKinds[name]; n > 0 {
		shard := strings.TrimSuffix(argString(args[3]), "dl")
		for _, kind := range kinds {
			rules = append(rules, "~"+globChars.ReplaceAllString(shard+kind, `\$0`)+"*")
		}
	}
	return name, rules
}

// argString is a command argument as go-redis writes it: the store passes
// some keys as *string.
func argString(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	return fmt.Sprint(a)
}

// inGuard marks the context of a command the guard runs: what go-redis
// sends meanwhile on it (a new connection's handshake) passes straight on.
type inGuard struct{}

// run runs cmd (or the transaction it opens) under its rules.
func (g *keyGuard) run(ctx context.Context, cmd redis.Cmder, next func(context.Context) error) error {
	if ctx.Value(inGuard{}) != nil {
		return next(ctx)
	}
	ctx = context.WithValue(ctx, inGuard{}, true)
	name, rules := g.rules(cmd)
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := strings.Join(rules, " "); r != g.cur {
		args := []any{"ACL", "SETUSER", guardUser}
		for _, x := range rules {
			args = append(args, x)
		}
		if err := g.admin.Do(ctx, args...).Err(); err != nil {
			cmd.SetErr(err)
			return err
		}
		g.cur = r
	}
	err := next(ctx)
	e := err // the command's own error may be set only once the hooks return
	if e == nil {
		e = cmd.Err()
	}
	if e != nil && (strings.Contains(e.Error(), "NOPERM") || strings.Contains(e.Error(), "can't access")) {
		g.vmu.Lock()
		g.violations = append(g.violations, fmt.Sprintf("%s %v: %v", name, cmd.Args()[1:], e))
		g.vmu.Unlock()
	}
	return err
}

func (g *keyGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *keyGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return g.run(ctx, cmd, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (g *keyGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" { // a transaction: no script in it
			return g.run(ctx, cmds[0], func(ctx context.Context) error { return next(ctx, cmds) })
		}
		var first error
		for _, c := range cmds {
			if err := g.run(ctx, c, func(ctx context.Context) error { return next(ctx, []redis.Cmder{c}) }); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}

func (g *keyGuard) check(t *testing.T) {
	t.Helper()
	g.vmu.Lock()
	defer g.vmu.Unlock()
	for _, v := range g.violations {
		t.Errorf("undeclared key: %s", v)
	}
	g.violations = nil
}

// guarded starts a store on r whose every command passes through g.
func guarded(t *testing.T, g *keyGuard, r *redistest.Server, cfg Config) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.URL = g.url(r)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	// New's own calls are not guarded (reconcile at start is, in recover):
	// they run with every key allowed, while guarded calls wait.
	g.mu.Lock()
	err := g.admin.Do(ctx, "ACL", "SETUSER", guardUser, "allkeys").Err()
	g.cur = "allkeys"
	var s *Store
	if err == nil {
		s, err = New(ctx, cfg)
	}
	if err == nil {
		s.rdb.AddHook(g)
	}
	g.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestScriptsDeclareTheirKeys: every script call touches only the keys it
// declares in KEYS, but for the documented exception (foundKinds). It runs
// the conformance suite, then the paths the suite does not reach (a dead
// node's connections, a late deadline, reconciliation, a disconnect of a
// user Redis lost), through keyGuard.
func TestScriptsDeclareTheirKeys(t *testing.T) {
	r := redistest.Start(t)
	g := newKeyGuard(t, r, loadScripts(0))

	t.Run("GuardRefusesUndeclared", func(t *testing.T) {
		s := guarded(t, g, r, Config{Node: "probe"})
		built := redis.NewScript("return redis.call('GET', ARGV[1])")
		g.names[built.Hash()] = "built"
		_, _ = built.Run(context.Background(), s.rdb, nil, "gd:{gd0}:u:bob").Result()
		g.vmu.Lock()
		n := len(g.violations)
		g.violations = nil
		g.vmu.Unlock()
		if n == 0 {
			t.Fatal("a script reached a key it did not declare and Redis let it")
		}
	})

	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.check(t) })
		return guarded(t, g, r, Config{Node: cfg.Node, TTL: cfg.TTL, Grace: cfg.Grace, ForgetAfter: cfg.ForgetAfter, Broadcasts: true,
			ChannelCountsTTL: cfg.ChannelCountsTTL, NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond})
	})

	t.Run("Occupancy", func(t *testing.T) {
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.check(t) })
		s := guarded(t, g, r, Config{Node: "a"})
		s.occupancyOn = true // as with Pusher webhooks: removals write the record
		ctx := context.Background()
		must(t, s.AddMember(ctx, "t", "bob"))
		must(t, s.AddMember(ctx, "t", "amy"))
		must(t, s.SetMemberInfo(ctx, "t", "bob", []byte(`{"name":"Bob"}`)))
		expectOcc(t, occ(t, s, "bob", true, 10, "t"), "[+t]")
		expectOcc(t, occ(t, s, "bob", false, 20, "t"), "[-t]") // read the truth, then vacated
		must(t, s.RemoveMember(ctx, "t", "bob"))
	})

	t.Run("FoundWhileRunning", func(t *testing.T) {
		ctx := context.Background()
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		cfg := Config{TTL: 2 * time.Second, Grace: 100 * time.Millisecond,
			NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond}
		cfg.Node = "a"
		a := guarded(t, g, r, cfg)
		cfg.Node = "b"
		b := guarded(t, g, r, cfg)
		for _, s := range []*Store{a, b} {
			s.Subscribe(resyncNop{})
		}
		must(t, a.AddMember(ctx, "t", "bob"))
		must(t, b.Connect(ctx, presence.Conn{ID: "b1", UserID: "bob", Device: "web"}))
		must(t, a.Connect(ctx, presence.Conn{ID: "a1", UserID: "carol", Device: "web"}))
		must(t, a.Connect(ctx, presence.Conn{ID: "a2", UserID: "dave", Device: "web"}))
		must(t, a.Connect(ctx, presence.Conn{ID: "a3", UserID: "erin", Device: "web"}))
		must(t, a.SetStatus(ctx, "a1", false))
		must(t, a.Heartbeat(ctx, "a1"))
		a.flushHeartbeats(ctx)

		// b dies: a's sweep releases b1 (dead node). a2's deadline is long
		// past: the safety net expires it. a3 leaves a's books behind its
		// back: reconciliation ends it.
		kill9(b)
		a.mu.Lock()
		delete(a.conns, "a3")
		a.mu.Unlock()
		// Reconciliation keeps a connection heard from in the millisecond it
		// starts or later (it may be newer than the live list): a3 is older.
		a3Seen, err := a.rdb.ZScore(ctx, dlKey(shardOfConn(t, "a3")), "a3").Result()
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 2*time.Second, func() error {
			now, err := a.rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			if seen := a3Seen - float64(cfg.TTL.Milliseconds()); float64(now.UnixMilli()) <= seen {
				return fmt.Errorf("Redis's clock %d not past a3's last heartbeat %.0f", now.UnixMilli(), seen)
			}
			return nil
		})
		must(t, a.recover(ctx))
		if _, err := r.Do("ZADD", dlKey(shardOf("dave")), "1", "a2"); err != nil {
			t.Fatal(err)
		}
		sweepFor(t, a, 1500*time.Millisecond)
		for _, id := range []string{"b1", "a2", "a3"} {
			if v, _ := r.Do("HEXISTS", prefix(shardOfConn(t, id))+"c", id); v != "0" {
				t.Errorf("%s was not ended", id)
			}
		}

		// Redis loses carol: her disconnect takes her through the grace.
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		must(t, a.Disconnect(ctx, "a1", presence.Closed))
		g.check(t)
	})
}

// resyncNop is a handler that asks for resyncs (so recover raises floors).
type resyncNop struct{ nopHandler }

func (resyncNop) OnResync(func(string) uint64) {}

// shardOfConn is the shard of the test connections' users.
func shardOfConn(t *testing.T, id string) int {
	t.Helper()
	user := map[string]string{"b1": "bob", "a1": "carol", "a2": "dave", "a3": "erin"}[id]
	if user == "" {
		t.Fatalf("no user for %s", id)
	}
	return shardOf(user)
}
