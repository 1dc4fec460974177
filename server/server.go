// Package server is greendot's gateway: the WebSocket protocol, the HTTP API,
// the fan-out of changes to connections and the metrics, around a store.
//
// Concurrency: the network layer is an epoll event loop (lesismal/nbio), so
// an idle connection costs no goroutine. Frame handlers run on nbio's worker
// pool and must not block for long; fan-out never blocks on a reader (see
// outbox.go). The Server owns three goroutines: the sweeper, the flusher and
// the membership worker, all stopped and waited for by Shutdown.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/logging"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// Config configures a Server. Only Store is required; the zero value of every
// other field is a working default.
type Config struct {
	Addr              string        // listen address; ":8080"
	Store             store.Store   // required
	NodeID            string        // this node's name; random when empty
	TTL               time.Duration // 25s
	HeartbeatInterval time.Duration // 10s
	PingInterval      time.Duration // silence before a WebSocket ping (ping.go); the heartbeat interval, <0 none
	Grace             time.Duration // 5s; only reported, the store applies it
	JWTSecret         string        // empty: dev mode
	JWTAudience       string        // when set, a token's "aud" (string or array) must include it
	JWTIssuer         string        // when set, a token's "iss" must be it
	APIKey            string        // empty: the HTTP API is open
	MaxMessageSize    int           // bytes per client frame; protocol.MaxFrameSize (128 KiB)
	RateLimit         float64       // client frames per second; 20
	RateBurst         int           // 40
	MaxPending        int           // queued changes per connection before it is slow; 10000
	// MaxWriteBuffer: unsent bytes per connection before it is closed as
	// slow; 4 MiB. It bounds HTTP responses too (a team presence of ~80,000
	// present members).
	MaxWriteBuffer int
	// SlowReaderTimeout: a connection whose socket does not take all that
	// was written to it for this long is closed with 1013 (its changes wait
	// meanwhile, one per subject, newest wins; the close frame gets as long
	// again to be taken). 30s; <0 never.
	SlowReaderTimeout time.Duration
	SocketSendBuffer  int           // SO_SNDBUF of each connection; 0 leaves the kernel's autotuning
	DrainSpread       time.Duration // reconnect delays are spread over this; 3s
	SweepInterval     time.Duration // 100ms
	FlushDelay        time.Duration // batching window for changes; 5ms
	// MaxConnecting bounds the connects a node registers at once; others
	// wait up to ConnectQueueWait, then get 503. A reconnect storm is then
	// served at the rate the store sustains instead of timing out as a whole
	// and being retried. 64 and 3s.
	MaxConnecting    int
	ConnectQueueWait time.Duration
	// MaxConnectionsPerUser bounds one user's live connections on this node
	// (not across nodes): the next connect gets 429. 20; <0 unlimited.
	MaxConnectionsPerUser int
	// LargeTeam: a team of more than this many members is large (DESIGN.md
	// Part 1b): its members reach a viewer only while watched, and viewers
	// get team_counts. 1000; <0 no team is large.
	LargeTeam int
	// AllowedOrigins, when not empty, lists the only Origin values (exact
	// scheme://host[:port], see ParseOrigins) an upgrade may carry; an
	// upgrade without Origin (not from a browser) is let through.
	AllowedOrigins []string
	// HandshakeTimeout bounds how long a socket may take to send a whole
	// request head, from its accept or from the end of its previous
	// response (the idle time of an HTTP keep-alive connection). 5s.
	HandshakeTimeout time.Duration
	// MaxUnauthenticatedPerIP bounds the sockets of one remote IP that have
	// not authenticated: no WebSocket upgrade accepted, no request with the
	// API key. The next one gets 429 at accept. 1024; <0 unlimited.
	MaxUnauthenticatedPerIP int
	// Pusher, when set, makes the listener speak Pusher Channels too
	// (pusher.go, docs/pusher.md).
	Pusher   PusherConfig
	Static   http.Handler // serves the demo page at /, if set
	Logger   *slog.Logger
	Registry *prometheus.Registry // metrics; a new registry when nil
	Now      func() time.Time
}

// Server is one greendot node.
type Server struct {
	cfg     Config
	log     *slog.Logger
	store   store.Store
	auth    *authenticator
	metrics *metrics
	reg     *prometheus.Registry
	hub     *hub
	px      *pxServer // nil unless Pusher compatibility is on

	upgrader   *websocket.Upgrader
	connecting chan struct{}       // a slot per connect being registered
	origins    map[string]struct{} // AllowedOrigins, lower case; empty: any

	// Connects past the per-user check and not yet in the hub, by user
	// (see reserveConn).
	userMu      sync.Mutex
	userPending map[string]int
	engine      *nbhttp.Engine
	// addConn hands an accepted socket to engine (a test makes it slow).
	addConn func(c *nbhttp.Conn, decrease func())
	pool    *workPool
	live    *livenessWheel
	ln      net.Listener
	addr    string

	refusedLog throttledLog
	adm        *admission
	walkers    frameWalkers
	// The big frames (over protocol.MaxSmallFrame) of a connection in a
	// run of refused frames are decoded holding a slot of it, or refused
	// when none is free (ws.go, onMessage): never closed.
	bigFrames chan struct{}

	draining atomic.Bool
	stopOnce sync.Once
	stop     chan struct{} // closed by Shutdown; never sent on
	wg       sync.WaitGroup
}

// New validates cfg and returns a Server that is not yet listening.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("server: a store is required")
	}
	if p := cfg.Pusher; (p.AppID == "") != (p.Key == "") || (p.AppID == "") != (p.Secret == "") {
		return nil, errors.New("server: Pusher compatibility needs all of app id, key and secret")
	}
	if cfg.Addr == "" {
		cfg.Addr = ":8080"
	}
	setDefault(&cfg.TTL, 25*time.Second)
	setDefault(&cfg.HeartbeatInterval, 10*time.Second)
	setDefault(&cfg.DrainSpread, 3*time.Second)
	setDefault(&cfg.SweepInterval, 100*time.Millisecond)
	setDefault(&cfg.FlushDelay, 5*time.Millisecond)
	setDefault(&cfg.ConnectQueueWait, 3*time.Second)
	setDefault(&cfg.HandshakeTimeout, 5*time.Second)
	if cfg.HandshakeTimeout < 0 {
		return nil, errors.New("server: handshake timeout must be positive")
	}
	if cfg.MaxUnauthenticatedPerIP == 0 {
		cfg.MaxUnauthenticatedPerIP = 1024
	}
	setDefault(&cfg.SlowReaderTimeout, 30*time.Second)
	if cfg.MaxConnecting <= 0 {
		cfg.MaxConnecting = 64
	}
	if cfg.MaxConnectionsPerUser == 0 {
		cfg.MaxConnectionsPerUser = 20
	}
	if cfg.LargeTeam == 0 {
		cfg.LargeTeam = 1000
	}
	origins := make(map[string]struct{}, len(cfg.AllowedOrigins))
	for _, o := range cfg.AllowedOrigins {
		norm, err := parseOrigin(o)
		if err != nil {
			return nil, fmt.Errorf("server: allowed origins: %w", err)
		}
		origins[norm] = struct{}{}
	}
	if cfg.Grace < 0 {
		return nil, errors.New("server: offline grace must not be negative")
	}
	if cfg.TTL <= cfg.HeartbeatInterval {
		return nil, fmt.Errorf("server: ttl (%v) must exceed the heartbeat interval (%v)", cfg.TTL, cfg.HeartbeatInterval)
	}
	setDefault(&cfg.PingInterval, cfg.HeartbeatInterval)
	if cfg.PingInterval >= cfg.TTL {
		return nil, fmt.Errorf("server: ping interval (%v) must be below the ttl (%v)", cfg.PingInterval, cfg.TTL)
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = protocol.MaxFrameSize
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = 20
	}
	if cfg.RateBurst == 0 {
		cfg.RateBurst = 40
	}
	if cfg.MaxWriteBuffer == 0 {
		cfg.MaxWriteBuffer = 4 << 20
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 10000
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-" + randomID(4)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{
		cfg:   cfg,
		log:   cfg.Logger,
		store: cfg.Store,
		auth:  newAuthenticator(cfg.JWTSecret, cfg.JWTAudience, cfg.JWTIssuer, cfg.Now),
		reg:   cfg.Registry,
		stop:  make(chan struct{}),

		origins:     origins,
		userPending: make(map[string]int),
		bigFrames:   make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2)),
	}
	s.metrics = newMetrics(cfg.Registry)
	if c, ok := cfg.Store.(store.MetricsSource); ok {
		cfg.Registry.MustRegister(c.Collectors()...)
	}
	s.hub = newHub(s)
	if o, ok := cfg.Store.(store.Observable); ok {
		o.SetObserver(s.metrics)
	}
	cfg.Store.Subscribe(s.hub)
	if cfg.Pusher.enabled() {
		s.px = newPusher(s)
	}
	s.upgrader = s.newUpgrader()
	s.live = newLivenessWheel(s)
	s.connecting = make(chan struct{}, cfg.MaxConnecting)
	s.addConn = func(c *nbhttp.Conn, decrease func()) { s.engine.AddConnNonTLSNonBlocking(c, nil, decrease) } // engine: made by Start
	return s, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

// DevMode reports whether clients may connect with ?user= (no JWT secret).
func (s *Server) DevMode() bool { return s.auth.devMode() }

// quietNetwork keeps nbio's own info lines out of our logs; its warnings stay.
var quietNetwork sync.Once

// Start listens and starts serving; it returns once the listener is up.
func (s *Server) Start() error {
	quietNetwork.Do(func() { logging.SetLevel(logging.LevelWarn) })
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("server: listen on %s: %w", s.cfg.Addr, err)
	}
	// No Addrs: the engine only polls; acceptLoop feeds it connections.
	// Unqueued: a job runs on an idle worker or on a new goroutine, never
	// behind a handler that waits on the store.
	s.pool = newWorkPool(32*runtime.GOMAXPROCS(0), 0)
	ncfg := nbhttp.Config{
		Name:                    "greendot",
		ServerExecutor:          s.pool.execute,
		Network:                 "tcp",
		Handler:                 s.routes(),
		MaxLoad:                 1 << 20,
		ReleaseWebsocketPayload: true,
		// A reader that lets this much pile up unsent is disconnected.
		MaxWriteBufferSize: s.cfg.MaxWriteBuffer,
		ReadBufferSize:     16 << 10,
		MaxHTTPBodySize:    maxBody,
		// What the parser buffers at once: a whole body and its head. The
		// head alone is bounded tighter by onData.
		ReadLimit: maxBody + 2*maxRequestHead,
		// nbio's read deadline from a socket's accept, and again after each
		// response: the whole next head must come within it. A head that
		// is complete moves it to requestTimeout (requestGate).
		KeepaliveTime: s.cfg.HandshakeTimeout,
	}
	s.adm = newAdmission(s.cfg.MaxUnauthenticatedPerIP)
	s.engine = nbhttp.NewEngine(ncfg)
	s.engine.OnData(s.onData)
	s.engine.OnClose(func(c net.Conn, _ error) {
		if nc, ok := c.(*nbio.Conn); ok {
			s.adm.closed(nc)
			s.walkers.delete(nc)
		}
	})
	s.engine.OnWrittenSize(s.onWritten)
	if err := s.engine.Start(); err != nil {
		_ = ln.Close()
		s.pool.close()
		s.adm.close()
		return fmt.Errorf("server: start network engine: %w", err)
	}
	s.adm.measure()
	s.ln = ln
	s.addr = ln.Addr().String()
	s.wg.Add(6)
	go s.live.loop()
	go s.countsLoop()
	go s.acceptLoop(ln)
	go s.sweepLoop()
	go s.hub.flush.loop()
	go s.hub.work.loop()
	if s.px != nil {
		s.wg.Add(1)
		go s.px.countsLoop()
	}
	return nil
}

// acceptLoop accepts connections and hands them to the engine's pollers,
// refusing those admission turns away. It ends when Shutdown closes the
// listener.
func (s *Server) acceptLoop(ln net.Listener) {
	defer s.wg.Done()
	defer s.adm.close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if outOfDescriptors(err) {
				s.acceptOverLimit(ln)
			} else {
				s.adm.log.note(s.log, "accept failed", "error", "err", err)
			}
			// Back off, don't spin, until descriptors are freed.
			select {
			case <-s.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		s.take(c)
	}
}

// take hands an accepted socket to the engine, or refuses it.
func (s *Server) take(c net.Conn) {
	if s.adm.full() {
		s.refuseSocket(c, reasonFDLimit)
		return
	}
	if tc, ok := c.(*net.TCPConn); ok && s.cfg.SocketSendBuffer > 0 {
		_ = tc.SetWriteBuffer(s.cfg.SocketSendBuffer)
	}
	ip := remoteIP(c)
	if reason := s.adm.admit(ip); reason != "" {
		s.refuseSocket(c, reason)
		return
	}
	// nbio takes a socket by duplicating its descriptor, which fails when
	// none is left: done here, the failure is a clean refusal instead of
	// nbio's own error line and a reset.
	nc, err := nbio.NBConnAccepted(c)
	if err != nil {
		s.adm.forget(ip)
		if !outOfDescriptors(err) {
			s.adm.log.note(s.log, "accept failed", "error", "err", err)
		}
		s.refuseSocket(c, reasonFDLimit)
		return
	}
	s.adm.track(nc, ip)
	hc := &nbhttp.Conn{Conn: nc}
	handover() // after every write the poller will read
	s.addConn(hc, func() { s.adm.closed(nc) })
	if s.adm.added(nc) {
		_ = nc.SetReadDeadline(time.Time{}) // see admission.added
	}
}

// upgradedSocket is the handlers', right after an accepted upgrade: it
// clears the read deadline that nbio's accept may have set after the
// upgrader cleared it (see admission.added).
func (s *Server) upgradedSocket(ws *websocket.Conn) {
	if nbc := nbioConn(ws); nbc != nil && s.adm.upgraded(nbc) {
		_ = nbc.SetReadDeadline(time.Time{})
	}
}

// Addr is the address the server listens on, with the real port.
func (s *Server) Addr() string { return s.addr }

// Shutdown drains the node: new connections are refused, every client is
// told to reconnect (spread over DrainSpread) and closed with 1012, so its
// users enter the offline grace instead of going offline. It then stops
// every goroutine of the Server and returns when they are gone or ctx ends.
// Calling it again does nothing.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		// Not ready, and new connections get 503, while clients are moved:
		// a load balancer sees the node leave before its port closes.
		s.draining.Store(true)
		drainStart := time.Now()
		idle := s.hub.count() == 0 && (s.px == nil || s.px.count() == 0)
		s.hub.drainAll(s.cfg.DrainSpread)
		if s.px != nil {
			s.px.drain(s.cfg.DrainSpread)
		}
		// Give closes a moment to be handled, so their users enter grace.
		waitUntil(ctx, 2*time.Second, func() bool { return s.hub.count() == 0 })
		// Keep answering 503 while clients come back (they wait up to
		// DrainSpread), so health checks see this node leave. A node that
		// had no client has nobody coming back: it stops at once.
		if !idle {
			select {
			case <-ctx.Done():
			case <-time.After(s.cfg.DrainSpread - time.Since(drainStart)):
			}
		}
		if s.ln != nil {
			_ = s.ln.Close()
		}
		close(s.stop)
		if s.px != nil {
			s.px.stop()
		}
		if s.engine != nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = s.engine.Shutdown(sctx)
			cancel()
			s.pool.close()
		}
		s.wg.Wait()
	})
	return err
}

func waitUntil(ctx context.Context, max time.Duration, cond func() bool) {
	deadline := time.Now().Add(max)
	for !cond() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// sweepLoop drives the store's deadlines and refreshes the gauges: every
// SweepInterval, and when a store.Scheduler's next grace end or status
// expiry is due, so that its change is published on time.
func (s *Server) sweepLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	sched, _ := s.store.(store.Scheduler)
	var rescheduled <-chan struct{}
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	arm := func() {
		if sched == nil {
			return
		}
		next := sched.NextDeadline()
		if next.IsZero() {
			due.Stop()
			return
		}
		// Clamped: a tick comes anyway, and a deadline due now must not
		// make the loop spin.
		due.Reset(min(max(next.Sub(s.cfg.Now()), time.Millisecond), s.cfg.SweepInterval))
	}
	if sched != nil {
		rescheduled = sched.Rescheduled()
		arm()
	}
	for {
		select {
		case <-s.stop:
			return
		case <-rescheduled:
			arm()
			continue
		case <-t.C:
		case <-due.C:
		}
		s.sweepOnce()
		arm()
	}
}

// sweepOnce runs the store's due deadlines and refreshes the gauges.
func (s *Server) sweepOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := s.store.Sweep(ctx); err != nil {
		s.metrics.storeErrors.WithLabelValues(store.OpSweep).Inc()
		s.log.Warn("sweep failed", "err", err)
	}
	cancel()
	s.metrics.connections.Set(float64(s.hub.count()))
	if c, ok := s.store.(store.Counter); ok {
		_, present := c.Counts()
		s.metrics.usersOnline.Set(float64(present))
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/connect", s.handleConnect)
	mux.HandleFunc("GET /v1/users/{user}/presence", s.api(s.handleUserPresence))
	mux.HandleFunc("PUT /v1/users/{user}/status", s.api(s.handlePutStatus))
	mux.HandleFunc("DELETE /v1/users/{user}/status", s.api(s.handleDeleteStatus))
	mux.HandleFunc("POST /v1/presence/query", s.api(s.handleQuery))
	mux.HandleFunc("GET /v1/teams/{team}/presence", s.api(s.handleTeamPresence))
	mux.HandleFunc("PUT /v1/teams/{team}/members/{user}", s.api(s.handleAddMember))
	mux.HandleFunc("DELETE /v1/teams/{team}/members/{user}", s.api(s.handleRemoveMember))
	if s.px != nil {
		s.px.routes(mux)
	}
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	// The same paths with any other method: a JSON 405, not the catch-all 404.
	for path, allowed := range map[string]string{
		"/v1/connect": "GET", "/v1/users/{user}/presence": "GET", "/v1/users/{user}/status": "PUT, DELETE",
		"/v1/presence/query":        "POST",
		"/v1/teams/{team}/presence": "GET", "/v1/teams/{team}/members/{user}": "PUT, DELETE",
		"/healthz": "GET", "/readyz": "GET", "/metrics": "GET",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allowed)
			writeError(w, http.StatusMethodNotAllowed, protocol.CodeMethod, r.Method+" is not allowed here; use "+allowed)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Static != nil && !strings.HasPrefix(r.URL.Path, "/v1/") && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			s.cfg.Static.ServeHTTP(w, r)
			return
		}
		writeError(w, http.StatusNotFound, protocol.CodeNotFound, "no such route: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

// maxRequestHead bounds the request line and headers of an HTTP request.
// nbio itself only bounds what it buffers (ReadLimit), and that must hold a
// whole body, so without this a client could keep a connection buffering
// megabytes of headers before any handler runs.
const maxRequestHead = 16 << 10

// maxBody bounds what nbio buffers of a request body (it buffers a body
// whole before the handler runs). Above the query route's own 1 MiB, so
// that route answers 413 itself.
const maxBody = 4 << 20

// onData feeds a connection's bytes to nbio's parser, through a requestGate
// while the connection speaks HTTP, and through onFrames (emptyframe.go)
// once it speaks WebSocket.
func (s *Server) onData(c *nbio.Conn, data []byte) {
	handover()
	var p *nbhttp.Parser
	switch sess := c.Session().(type) {
	case *nbhttp.Parser:
		p = sess
	case *websocket.Conn:
		s.onFrames(c, sess, data)
		return
	default:
		c.DataHandler()(c, data)
		return
	}
	g, ok := p.Processor.(*requestGate)
	if !ok {
		// The parser's first bytes: nbio made its processor just before.
		g = &requestGate{Processor: p.Processor, apiKey: s.cfg.APIKey, pusher: s.px != nil, conn: c, adm: s.adm}
		p.Processor = g
	}
	if g.upgraded {
		c.DataHandler()(c, data)
		return
	}
	if g.refused {
		return // closing: nothing more is read
	}
	if !g.inBody {
		g.head += len(data)
	}
	c.DataHandler()(c, data)
	switch {
	case g.upgraded:
	case g.tooBig || (!g.inBody && g.head > maxRequestHead):
		// Checked after the parse, so one read (ReadBufferSize) may pass
		// the limit: the head buffered stays under limit + one read.
		s.refuse(c, g, http.StatusRequestHeaderFieldsTooLarge, protocol.CodeHeadTooLarge,
			"request line and headers over 16 KiB", reasonHeadTooLarge)
	case g.inBody && g.needsKey:
		s.refuse(c, g, http.StatusUnauthorized, protocol.CodeUnauthorized,
			"a request body needs the API key (Authorization: Bearer <key>)", reasonBodyUnauthorized)
	}
}

// refuse answers a request the gate stopped before its handler, and closes
// the connection: the rest of the request is never read.
func (s *Server) refuse(c *nbio.Conn, g *requestGate, status int, code, msg, reason string) {
	g.refused = true
	s.metrics.httpRefused.WithLabelValues(reason).Inc()
	s.refusedLog.note(s.log, "refused HTTP requests before their handler (head over 16 KiB, or a body without the API key)", reason)
	b, _ := json.Marshal(map[string]map[string]string{"error": {"code": code, "message": msg}})
	b = append(b, '\n')
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), len(b))
	_, _ = c.Write(append([]byte(head), b...))
	_ = c.CloseWithError(errRefused)
}

var errRefused = errors.New("server: request refused before its handler")

// requestGate wraps nbio's request processor of one connection to see where
// the parser is: in a request's head, or in its body. It only observes;
// onData acts on what it saw. nbio calls it on the connection's poller
// goroutine, as it calls onData.
type requestGate struct {
	nbhttp.Processor
	apiKey string
	pusher bool // Pusher's REST API is on: its requests are signed, not keyed
	conn   *nbio.Conn
	adm    *admission

	head     int  // bytes read since the current request's head began (about)
	inBody   bool // the head is complete; the body is being read
	sawKey   bool // an Authorization header was seen
	keyOK    bool // the first one carries the API key
	bodyNext bool // the head announces a body
	needsKey bool // a body without the API key, when one is required
	upgrade  bool // the head asks for a protocol upgrade
	upgraded bool // an upgrade request was handed over: WebSocket frames follow
	signed   bool // a Pusher REST request: its handler checks its signature
	refused  bool
	// headBytes counts the request line and headers as parsed, so that a
	// head over the limit is refused even when it arrived whole in one or
	// two reads; tooBig then holds the request back from its handler.
	headBytes int
	tooBig    bool
}

func (g *requestGate) OnMethod(p *nbhttp.Parser, method string) {
	*g = requestGate{Processor: g.Processor, apiKey: g.apiKey, pusher: g.pusher, conn: g.conn, adm: g.adm, head: g.head, headBytes: len(method)}
	g.Processor.OnMethod(p, method)
}

func (g *requestGate) OnURL(p *nbhttp.Parser, uri string) error {
	g.headBytes += len(uri)
	g.signed = g.pusher && strings.HasPrefix(uri, "/apps/")
	return g.Processor.OnURL(p, uri)
}

func (g *requestGate) OnHeader(p *nbhttp.Parser, key, value string) {
	g.headBytes += len(key) + len(value) + 4 // ": " and CRLF
	switch key {
	case "Authorization":
		if !g.sawKey { // the handlers read the first one too
			g.sawKey = true
			g.keyOK = apiKeyOK(g.apiKey, &http.Request{Header: http.Header{key: {value}}})
		}
	case "Transfer-Encoding":
		g.bodyNext = true
	case "Upgrade":
		g.upgrade = true
	}
	g.Processor.OnHeader(p, key, value)
}

// OnContentLength is nbio's call at the end of a head.
func (g *requestGate) OnContentLength(p *nbhttp.Parser, n int) {
	g.tooBig = g.headBytes > maxRequestHead
	g.inBody, g.head = true, 0
	g.needsKey = g.apiKey != "" && !g.keyOK && !g.signed && (n > 0 || g.bodyNext)
	// The head came within the handshake timeout; the body, the handler and
	// the response get longer. nbio sets the deadline again after the
	// response (KeepaliveTime, the handshake timeout).
	_ = g.conn.SetReadDeadline(time.Now().Add(requestTimeout))
	g.Processor.OnContentLength(p, n)
}

func (g *requestGate) OnComplete(p *nbhttp.Parser) {
	if g.tooBig {
		return // onData refuses it; the handler never sees it
	}
	g.inBody, g.head, g.needsKey = false, 0, false
	if g.keyOK && g.apiKey != "" && !g.upgrade {
		g.adm.authenticated(g.conn) // an upgrade counts once accepted (handleConnect)
	}
	// From here on the bytes may be WebSocket frames: the handler (on a
	// worker) may upgrade at any moment. A refused upgrade closes the
	// connection (see handleConnect), so no later request goes ungated.
	g.upgraded = g.upgrade
	g.Processor.OnComplete(p)
}
