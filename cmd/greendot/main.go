// Command greendot is the presence server.
//
//	greendot serve [flags]              run a node
//	greendot token --secret S --user U  print a signed client token
//	greendot bench <scenario> [flags]   drive a running server and measure it
//	greendot healthcheck [--url U]      exit 0 when a node answers 200 on /readyz
//	greendot version                    print the version, commit and Go version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot"
	"github.com/greendot/greendot/internal/gctune"
	"github.com/greendot/greendot/internal/logthrottle"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/webhook"
)

const usage = `greendot: a presence server

usage:
  greendot serve [flags]               run a node (greendot serve -h lists the flags)
  greendot token --secret S --user U   print a signed client token (HS256 JWT)
  greendot bench <scenario> [flags]    drive a running server and measure it (greendot bench -h)
  greendot healthcheck [--url URL]     exit 0 when a node is ready (for container health checks)
  greendot version                     print the version, commit and Go version (also --version)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(context.Background(), os.Args[2:], os.Stderr)
	case "token":
		err = token(os.Args[2:], os.Stdout)
	case "bench":
		err = bench(os.Args[2:], os.Stdout, os.Stderr)
	case "healthcheck":
		err = healthcheck(os.Args[2:], os.Stdout, os.Stderr, os.Getenv)
	case "version", "--version", "-version":
		err = printVersion(os.Args[2:], os.Stdout)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "greendot: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "greendot:", err)
		os.Exit(1)
	}
}

type serveOptions struct {
	addr              string
	storeKind         string
	redisURL          string
	nodeID            string
	ttl               time.Duration
	heartbeatInterval time.Duration
	grace             time.Duration
	forgetAfter       time.Duration
	jwtSecret         string
	jwtAudience       string
	jwtIssuer         string
	apiKey            string
	logLevel          string
	logRepeat         time.Duration
	pprofAddr         string
	maxConnecting     int
	maxUserConns      int
	largeTeam         int
	allowedOrigins    string
	handshakeTimeout  time.Duration
	maxUnauthPerIP    int
	origins           []string // allowedOrigins, parsed by validate
	webhookURL        string
	webhookSecret     string
	webhookRetryFor   time.Duration
	webhookQueue      int
	webhookTimeout    time.Duration
	webhookKey        webhook.Secret // webhookSecret, parsed by validate
	pusherAppID       string
	pusherKey         string
	pusherSecret      string
	pusherClientEvts  bool
	pusherWebhookURL  string
}

// minSecretBytes is the shortest --jwt-secret taken without a warning: an
// HS256 key shorter than the hash's 256 bits weakens it (RFC 7518, 3.2).
const minSecretBytes = 32

func serveFlags(o *serveOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", ":8080", "listen address (WebSocket, HTTP API, metrics, demo page)")
	fs.StringVar(&o.storeKind, "store", "memory", "memory (embedded, one node) or redis")
	fs.StringVar(&o.redisURL, "redis-url", "", "redis://[user:pass@]host:port[/db]")
	fs.StringVar(&o.nodeID, "node-id", "", "this node's name among many (default hostname + random)")
	durationVar(fs, &o.ttl, "ttl", 25*time.Second, "a connection that sends nothing for this `duration` is dead")
	durationVar(fs, &o.heartbeatInterval, "heartbeat-interval", 10*time.Second, "the `duration` clients are told to leave between heartbeats")
	durationVar(fs, &o.grace, "offline-grace", 5*time.Second, "the `duration` a user with no connection left stays online")
	durationVar(fs, &o.forgetAfter, "forget-after", 720*time.Hour, "drop the presence of a user offline for this `duration` (answered as never seen; teams kept); 0 = never")
	fs.StringVar(&o.jwtSecret, "jwt-secret", "", "HS256 secret for client tokens; unset = dev mode")
	fs.StringVar(&o.jwtAudience, "jwt-audience", "", `when set, a client token's "aud" (string or array) must include this value`)
	fs.StringVar(&o.jwtIssuer, "jwt-issuer", "", `when set, a client token's "iss" must be this value`)
	fs.StringVar(&o.apiKey, "api-key", "", "bearer key required on the HTTP API (all /v1 routes but /v1/connect)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	durationVar(fs, &o.logRepeat, "log-repeat-interval", 10*time.Second, "a log line repeated within this `duration` is held back and counted in one summary line per interval; 0 = log every line")
	fs.IntVar(&o.maxConnecting, "max-connecting", 64, "connects a node registers at once; more wait up to 3s, then get 503")
	fs.IntVar(&o.largeTeam, "large-team", 1000, "a team of more than this many members is large: viewers get its members only when they watch them, and team_counts; 0 = no team is large")
	fs.IntVar(&o.maxUserConns, "max-connections-per-user", 20, "live connections one user may hold on this node (per node, not cluster-wide); the next gets 429; 0 = unlimited")
	fs.StringVar(&o.allowedOrigins, "allowed-origins", "", "comma-separated origins (exact scheme://host[:port]) whose pages may open WebSockets; empty = any")
	durationVar(fs, &o.handshakeTimeout, "handshake-timeout", 5*time.Second, "a socket must send a whole request head within this `duration` of its accept, or of its previous response")
	fs.IntVar(&o.maxUnauthPerIP, "max-unauthenticated-per-ip", 1024, "sockets one remote IP may hold before a WebSocket upgrade (a Pusher socket: a signed subscription or sign-in) or a request with the API key; the next gets 429; 0 = unlimited")
	fs.StringVar(&o.webhookURL, "webhook-url", "", "POST a presence.changed webhook (Standard Webhooks) to this URL for every published change; off when empty")
	fs.StringVar(&o.webhookSecret, "webhook-secret", "", "whsec_<base64> key that signs the webhooks (required with --webhook-url)")
	durationVar(fs, &o.webhookRetryFor, "webhook-retry-for", 24*time.Hour, "a webhook not delivered this `duration` after its change is dropped")
	fs.IntVar(&o.webhookQueue, "webhook-queue", 100000, "webhook events waiting at most (cluster-wide on Redis); past it the oldest are dropped")
	durationVar(fs, &o.webhookTimeout, "webhook-timeout", 10*time.Second, "a webhook request not answered within this `duration` has failed and is retried")
	fs.StringVar(&o.pusherAppID, "pusher-app-id", "", "with --pusher-key and --pusher-secret: speak Pusher Channels (pusher-js, Laravel Echo) at /app/{key} and its REST API at /apps/{id}/ (docs/pusher.md)")
	fs.StringVar(&o.pusherKey, "pusher-key", "", "the Pusher app key that pusher-js connects with")
	fs.StringVar(&o.pusherSecret, "pusher-secret", "", "the Pusher app secret that signs channel auth, user sign-in and REST requests")
	fs.BoolVar(&o.pusherClientEvts, "pusher-client-events", false, "relay client-* events between the sockets of private and presence channels")
	fs.StringVar(&o.pusherWebhookURL, "pusher-webhook-url", "", "POST Pusher-format presence webhooks (member_added, member_removed, channel_occupied, channel_vacated) to this URL, signed with --pusher-secret; with or without --webhook-url")
	fs.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's pprof profiles on this address (e.g. 127.0.0.1:6060); off when empty")
	return fs
}

// parseWithEnv parses args; a flag not given reads GREENDOT_<FLAG> instead.
func parseWithEnv(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "GREENDOT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %v", env, v, e)
			}
		}
	})
	return err
}

func (o *serveOptions) validate() error {
	switch {
	case o.ttl <= 0:
		return fmt.Errorf("--ttl must be positive, got %v", o.ttl)
	case o.heartbeatInterval <= 0:
		return fmt.Errorf("--heartbeat-interval must be positive, got %v", o.heartbeatInterval)
	case o.ttl <= o.heartbeatInterval:
		return fmt.Errorf("--ttl (%v) must exceed --heartbeat-interval (%v)", o.ttl, o.heartbeatInterval)
	case o.grace < 0:
		return fmt.Errorf("--offline-grace must not be negative, got %v", o.grace)
	case o.forgetAfter < 0:
		return fmt.Errorf("--forget-after must not be negative (0 = never), got %v", o.forgetAfter)
	case o.forgetAfter > 0 && o.forgetAfter < o.grace:
		return fmt.Errorf("--forget-after (%v) must be 0 (never) or at least --offline-grace (%v)", o.forgetAfter, o.grace)
	case o.logRepeat < 0:
		return fmt.Errorf("--log-repeat-interval must not be negative (0 = every line), got %v", o.logRepeat)
	case o.maxConnecting < 1:
		return fmt.Errorf("--max-connecting must be at least 1, got %d", o.maxConnecting)
	case o.handshakeTimeout <= 0:
		return fmt.Errorf("--handshake-timeout must be positive, got %v", o.handshakeTimeout)
	case o.maxUnauthPerIP < 0:
		return fmt.Errorf("--max-unauthenticated-per-ip must be 0 (unlimited) or more, got %d", o.maxUnauthPerIP)
	case o.largeTeam < 0:
		return fmt.Errorf("--large-team must be 0 (no team is large) or more, got %d", o.largeTeam)
	case o.maxUserConns < 0:
		return fmt.Errorf("--max-connections-per-user must be 0 (unlimited) or more, got %d", o.maxUserConns)
	case o.jwtSecret == "" && (o.jwtAudience != "" || o.jwtIssuer != ""):
		return errors.New("--jwt-audience and --jwt-issuer check tokens: they need --jwt-secret")
	}
	if err := o.validateWebhooks(); err != nil {
		return err
	}
	origins, err := server.ParseOrigins(o.allowedOrigins)
	if err != nil {
		return fmt.Errorf("--allowed-origins: %v", err)
	}
	o.origins = origins
	switch o.storeKind {
	case "memory":
	case "redis":
		if o.redisURL == "" {
			return errors.New("--store redis needs --redis-url")
		}
	default:
		return fmt.Errorf("unknown --store %q (memory or redis)", o.storeKind)
	}
	return nil
}

func (o *serveOptions) validateWebhooks() error {
	switch {
	case o.webhookURL == "" && o.webhookSecret != "":
		return errors.New("--webhook-secret without --webhook-url: set both to send webhooks")
	case o.webhookURL != "" && o.webhookSecret == "":
		return errors.New("--webhook-url needs --webhook-secret (whsec_<base64>) to sign the webhooks")
	case o.pusherWebhookURL != "" && (o.pusherAppID == "" || o.pusherKey == "" || o.pusherSecret == ""):
		return errors.New("--pusher-webhook-url needs --pusher-app-id, --pusher-key and --pusher-secret (the secret signs the webhooks)")
	case o.webhookURL == "" && o.pusherWebhookURL == "":
		return nil
	case o.webhookRetryFor <= 0:
		return fmt.Errorf("--webhook-retry-for must be positive, got %v", o.webhookRetryFor)
	case o.webhookQueue < 1:
		return fmt.Errorf("--webhook-queue must be at least 1, got %d", o.webhookQueue)
	case o.webhookTimeout <= 0:
		return fmt.Errorf("--webhook-timeout must be positive, got %v", o.webhookTimeout)
	}
	for _, f := range [][2]string{{"--webhook-url", o.webhookURL}, {"--pusher-webhook-url", o.pusherWebhookURL}} {
		if u, err := url.Parse(f[1]); f[1] != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			return fmt.Errorf("%s %q: want an absolute http:// or https:// URL", f[0], f[1])
		}
	}
	if o.webhookURL == "" {
		return nil
	}
	key, err := webhook.ParseSecret(o.webhookSecret)
	if err != nil {
		return fmt.Errorf("--webhook-secret: %v", err)
	}
	o.webhookKey = key
	return nil
}

// validatePusher: all three of app id, key and secret, or none, in the
// characters Pusher's own use (they appear in URLs and signed strings).
func (o *serveOptions) validatePusher() error {
	set := 0
	for _, v := range []string{o.pusherAppID, o.pusherKey, o.pusherSecret} {
		if v != "" {
			set++
		}
	}
	switch {
	case set == 0 && o.pusherClientEvts:
		return errors.New("--pusher-client-events needs --pusher-app-id, --pusher-key and --pusher-secret")
	case set == 0:
		return nil
	case set < 3:
		return errors.New("Pusher compatibility needs all three of --pusher-app-id, --pusher-key and --pusher-secret")
	}
	for name, v := range map[string]string{"--pusher-app-id": o.pusherAppID, "--pusher-key": o.pusherKey} {
		for _, r := range v {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("%s %q: use letters, digits, - and _ only", name, v)
			}
		}
	}
	return nil
}

// serve runs a node until SIGTERM, SIGINT or the end of ctx, then drains it.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	var o serveOptions
	fs := serveFlags(&o)
	fs.SetOutput(stderr)
	if err := parseWithEnv(fs, args, os.Getenv); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	if err := o.validatePusher(); err != nil {
		return err
	}
	// A node's heap is mostly small, long-lived connection state: collecting
	// at 50% growth instead of 100% keeps RSS per idle connection under the
	// 4 KiB target at the same CPU, and at 10% while the node allocates
	// little (internal/gctune, docs/operations.md). GOGC still wins.
	if os.Getenv("GOGC") == "" {
		stopTuner, err := gctune.Start(gctune.Defaults)
		if err != nil {
			return err
		}
		defer stopTuner()
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %v", err)
	}
	log, throttle := newLogger(stderr, level, o.logRepeat)
	defer throttle.Flush()
	if o.nodeID == "" {
		host, _ := os.Hostname()
		o.nodeID = host + "-" + randomSuffix()
	}

	// Both formats read the one queue of changes, each with a Sender of its
	// own: on Redis a consumer group each on the same streams, on the
	// memory store a MemQueue each. An event is still emitted once, by the
	// change, and each format's receiver is retried on its own.
	type hookOut struct {
		cfg   webhook.Config
		group string // on Redis
		src   webhook.Source
	}
	var outs []*hookOut
	if o.webhookURL != "" {
		outs = append(outs, &hookOut{group: redisstore.WebhookGroup,
			cfg: webhook.Config{URL: o.webhookURL, Secret: o.webhookKey}})
	}
	if o.pusherWebhookURL != "" {
		outs = append(outs, &hookOut{group: redisstore.PusherWebhookGroup,
			cfg: webhook.Config{URL: o.pusherWebhookURL, Metrics: webhook.NewPusherMetrics(),
				Format: webhook.Pusher{Key: o.pusherKey, Secret: o.pusherSecret}}})
	}
	webhooks := len(outs) > 0
	whQueue := 0
	if webhooks {
		whQueue = o.webhookQueue
	}
	var st store.Store
	var memQueues []*webhook.MemQueue
	switch o.storeKind {
	case "redis":
		redis.SetLogger(redisLog{log})
		var groups []string
		for _, h := range outs {
			groups = append(groups, h.group)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rs, err := redisstore.New(ctx, redisstore.Config{URL: o.redisURL, Node: o.nodeID, TTL: o.ttl, Grace: o.grace,
			ForgetAfter: o.forgetAfter, WebhookQueue: whQueue, WebhookGroups: groups, Logger: log,
			Broadcasts: o.pusherAppID != ""})
		cancel()
		if err != nil {
			return err
		}
		defer rs.Close()
		st = rs
		for _, h := range outs {
			h.src = rs.WebhookSource(h.group)
		}
	default:
		cfg := memstore.Config{TTL: o.ttl, Grace: o.grace, ForgetAfter: o.forgetAfter}
		for _, h := range outs {
			q := webhook.NewMemQueue(whQueue)
			memQueues = append(memQueues, q)
			h.src = q
		}
		if len(memQueues) > 0 {
			cfg.OnChange = func(ev store.PresenceEvent) {
				for _, q := range memQueues {
					q.Add(ev)
				}
			}
		}
		ms, err := memstore.New(cfg)
		if err != nil {
			return err
		}
		st = ms
	}
	reg := prometheus.NewRegistry()
	var senders []*webhook.Sender
	for _, h := range outs {
		h.cfg.Timeout, h.cfg.RetryFor, h.cfg.Logger = o.webhookTimeout, o.webhookRetryFor, log
		sender, err := webhook.NewSender(h.cfg, h.src)
		if err != nil {
			return err
		}
		reg.MustRegister(sender.Metrics().Collectors()...)
		sender.Start()
		defer sender.Stop() // before the store closes: deferred after it
		senders = append(senders, sender)
	}

	largeTeam := o.largeTeam
	if largeTeam == 0 {
		largeTeam = -1 // the flag's 0 is none; Config's 0 means its default
	}
	userConns := o.maxUserConns
	if userConns == 0 {
		userConns = -1 // the flag's 0 is unlimited; Config's 0 means its default
	}
	unauthPerIP := o.maxUnauthPerIP
	if unauthPerIP == 0 {
		unauthPerIP = -1
	}
	srv, err := server.New(server.Config{
		Addr:                    o.addr,
		Store:                   st,
		NodeID:                  o.nodeID,
		TTL:                     o.ttl,
		HeartbeatInterval:       o.heartbeatInterval,
		Grace:                   o.grace,
		JWTSecret:               o.jwtSecret,
		JWTAudience:             o.jwtAudience,
		JWTIssuer:               o.jwtIssuer,
		APIKey:                  o.apiKey,
		MaxConnecting:           o.maxConnecting,
		MaxConnectionsPerUser:   userConns,
		LargeTeam:               largeTeam,
		AllowedOrigins:          o.origins,
		HandshakeTimeout:        o.handshakeTimeout,
		MaxUnauthenticatedPerIP: unauthPerIP,
		Pusher: server.PusherConfig{AppID: o.pusherAppID, Key: o.pusherKey, Secret: o.pusherSecret,
			ClientEvents: o.pusherClientEvts},
		Static:   greendot.DemoHandler(),
		Logger:   log,
		Registry: reg,
	})
	if err != nil {
		return err
	}
	if o.pprofAddr != "" {
		stopProfiles, err := serveProfiles(o.pprofAddr, log)
		if err != nil {
			return err
		}
		defer stopProfiles()
	}

	if err := srv.Start(); err != nil {
		return err
	}
	base := "localhost" + o.addr
	if !strings.HasPrefix(o.addr, ":") {
		base = o.addr
	}
	log.Info("greendot serving", "addr", o.addr, "store", o.storeKind, "node", o.nodeID,
		"ttl", o.ttl, "heartbeat_interval", o.heartbeatInterval, "offline_grace", o.grace, "forget_after", o.forgetAfter)
	if srv.DevMode() {
		log.Warn("DEV MODE: no --jwt-secret set, so ANY client may connect as ANY user with ?user=<id>. Never run this in production.")
		fmt.Fprintf(stderr, "\n  demo page:  http://%s/\n  connect:    ws://%s/v1/connect?user=alice\n  metrics:    http://%s/metrics\n\n", base, base, base)
	}
	if n := len(o.jwtSecret); n > 0 && n < minSecretBytes {
		log.Warn("--jwt-secret is short: tokens signed with it can be forged by guessing it; use at least 32 random bytes", "bytes", n)
	}
	if webhooks {
		log.Info("webhooks on", "url", o.webhookURL, "pusher_url", o.pusherWebhookURL, "retry_for", o.webhookRetryFor,
			"queue", o.webhookQueue, "timeout", o.webhookTimeout)
	}
	if o.apiKey == "" {
		log.Warn("no --api-key set: the HTTP API (/v1/users, /v1/teams, /v1/presence) is open to anyone who can reach it")
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	stop()
	log.Info("draining: telling clients to reconnect elsewhere")
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if len(memQueues) > 0 {
		// The memory queue dies with the process: give the changes of the
		// drain (and those still waiting) a few seconds to go out, in
		// every format at once.
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		var wg sync.WaitGroup
		for _, s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.Drain(dctx)
			}()
		}
		wg.Wait()
		dcancel()
	}
	log.Info("stopped")
	return nil
}

// newLogger is the process's logger: text lines on w from level up, a line
// repeated within repeat held back and summarised (logthrottle). The caller
// flushes the throttle before exiting.
func newLogger(w io.Writer, level slog.Level, repeat time.Duration) (*slog.Logger, *logthrottle.Handler) {
	h := logthrottle.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}), repeat)
	return slog.New(h), h
}

// redisLog sends go-redis's own log lines (its dial retries, for one) to
// the debug level: at any other level they would come before, and say less
// than, greendot's own one-line error about the same failure. They share one
// message, so that the throttle counts them as one kind of line however
// their text varies.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis", "line", fmt.Sprintf(format, v...))
}
