package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/greendot/greendot/protocol"
)

// Options configures a Client. The zero value works against a dev-mode
// server only if User is set; every other field has a default.
type Options struct {
	// Token is a JWT sent as "Authorization: Bearer" on every connect.
	Token string
	// TokenFunc, if set, is called for a token before every connect and
	// reconnect (after a 4001 "token expired" close, the client reconnects
	// at once with what it returns). Set Token or TokenFunc, not both.
	TokenFunc func(ctx context.Context) (string, error)
	// User is the dev-mode identity, sent as ?user=. A server with a JWT
	// secret refuses it.
	User string
	// Device names this connection's device; default "web".
	Device string

	// Header is added to every handshake request.
	Header http.Header
	// HTTPClient performs the handshake (custom transports, TLS, proxies);
	// default http.DefaultClient.
	HTTPClient *http.Client

	// OnChange, if set, is called for every change applied to the local
	// presence map, in order, on the client's read goroutine (and, for the
	// first snapshot, on the goroutine calling Dial). It must not block: a
	// slow OnChange holds up the reading of the connection. Change.Received
	// is the moment the frame was read.
	OnChange func(Change)
	// OnMyStatus, if set, is called with the user's own status whenever the
	// server tells it (my_status: after welcome when not the default, and
	// on every change, from any device), on the read goroutine. It must not
	// block.
	OnMyStatus func(UserStatus)
	// ChangesBuffer is the capacity of the Changes channel; default 256.
	ChangesBuffer int
	// DisableChanges leaves the Changes channel unfed, for programs that
	// only use OnChange or the map (a load generator with thousands of
	// clients): no change is queued for a reader that never comes.
	DisableChanges bool
	// OnStateChange, if set, is called on every change of the connection
	// state, on the goroutine that connects. It must not block and must not
	// call Close.
	OnStateChange func(StateChange)

	// ReconnectBase and ReconnectMax bound the reconnect backoff: attempt n
	// waits uniform in [0, min(ReconnectMax, ReconnectBase·2ⁿ)). Defaults
	// 1s and 30s. ReconnectMax also caps a server's reconnect advice.
	ReconnectBase time.Duration
	ReconnectMax  time.Duration
	// DialTimeout bounds one connect attempt (handshake, welcome and
	// snapshot), Dial's included; default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds the write of one frame; default 10s.
	WriteTimeout time.Duration
	// ReadLimit is the largest frame accepted (a snapshot of a big team is
	// one frame); default 16 MiB.
	ReadLimit int64

	// HeartbeatInterval, if positive, replaces the interval the server
	// advertises in welcome (load generators). The jitter still applies:
	// each gap is uniform in [0.7, 1.0]·interval.
	HeartbeatInterval time.Duration
	// DisableHeartbeats stops automatic heartbeats; Ping still works. The
	// server then expires the connection after its ttl unless something
	// else is sent.
	DisableHeartbeats bool

	// Logger receives connection events; default discards.
	Logger *slog.Logger

	hooks testHooks
}

// testHooks let the package's tests watch what the client does.
type testHooks struct {
	onSend       func(frameType string, at time.Time) // after each frame written
	onSessionEnd func(cause error)                    // after each connection ended
}

func (o Options) withDefaults() (Options, error) {
	if o.Token != "" && o.TokenFunc != nil {
		return o, errors.New("client: set Token or TokenFunc, not both")
	}
	if o.User != "" && !protocol.ValidID(o.User) {
		return o, errors.New("client: User must be 1-128 bytes of printable UTF-8")
	}
	if o.Device == "" {
		o.Device = "web"
	}
	if !protocol.ValidID(o.Device) {
		return o, errors.New("client: Device must be 1-128 bytes of printable UTF-8")
	}
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	if o.ChangesBuffer <= 0 {
		o.ChangesBuffer = 256
	}
	if o.ReconnectBase <= 0 {
		o.ReconnectBase = time.Second
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = 30 * time.Second
	}
	if o.ReconnectMax < o.ReconnectBase {
		return o, errors.New("client: ReconnectMax must not be below ReconnectBase")
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 16 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// connectURL adds device and user to the endpoint's query.
func (o *Options) connectURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("client: bad url: %w", err)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return "", fmt.Errorf("client: bad url %q: scheme must be ws or wss", endpoint)
	}
	q := u.Query()
	q.Set("device", o.Device)
	if o.User != "" {
		q.Set("user", o.User)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}
