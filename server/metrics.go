package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// Label values come from closed sets of constants, never from a client.
const (
	reasonBadRequest   = "bad_request"
	reasonUnknownType  = "unknown_type"
	reasonRateLimited  = "rate_limited"
	reasonBinary       = "binary"
	reasonProtocol     = "protocol_error"
	reasonUnauthorized = "unauthorized"
	reasonDraining     = "draining"
	reasonOverloaded   = "overloaded"
	reasonRecovering   = "recovering"
	reasonStale        = "stale"
	reasonSlow         = "slow_consumer"

	reasonTooManyConns    = "too_many_connections"
	reasonForbiddenOrigin = "forbidden_origin"

	// HTTP requests refused before their handler (server.go, onData).
	reasonHeadTooLarge     = "header_too_large"
	reasonBodyUnauthorized = "body_without_api_key"
)

type metrics struct {
	connections        prometheus.Gauge
	usersOnline        prometheus.Gauge
	heartbeats         prometheus.Counter
	frames             *prometheus.CounterVec
	framesRejected     *prometheus.CounterVec
	connectsRejected   *prometheus.CounterVec
	httpRefused        *prometheus.CounterVec
	socketsRefused     *prometheus.CounterVec
	heartbeatGap       prometheus.Histogram
	expirations        prometheus.Counter
	detectionLag       prometheus.Histogram
	graceLag           prometheus.Histogram
	graceStarted       prometheus.Counter
	graceCancellations prometheus.Counter
	statusExpirations  prometheus.Counter
	changes            *prometheus.CounterVec
	fanout             prometheus.Histogram
	deliveries         prometheus.Counter
	coalesced          prometheus.Counter
	dropped            *prometheus.CounterVec
	slowDisconnects    prometheus.Counter
	slowConsumers      prometheus.Gauge
	slowCoalesced      prometheus.Counter
	slowTimeouts       prometheus.Counter
	storeLatency       *prometheus.HistogramVec
	storeErrors        *prometheus.CounterVec
	resyncs            prometheus.Counter
	resyncDeliveries   prometheus.Counter

	// Pusher compatibility (pusher.go); label values from closed sets.
	pusherConns           prometheus.Gauge
	pusherFrames          *prometheus.CounterVec
	pusherSubscribeErrors *prometheus.CounterVec
	pusherMemberEvents    *prometheus.CounterVec
	pusherDelivered       prometheus.Counter
	pusherREST            *prometheus.CounterVec

	// Resolved once: the heartbeat path is the hottest there is.
	heartbeatFrames prometheus.Counter
	heartbeatErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "greendot"
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "connections",
			Help: "Live WebSocket connections on this node."}),
		usersOnline: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "users_online",
			Help: "Users whose published state is online or away."}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "heartbeats_total",
			Help: "Heartbeat frames received."}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "frames_received_total",
			Help: "Valid client frames received, by type."}, []string{"type"}),
		framesRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "frames_rejected_total",
			Help: "Client frames refused, by reason."}, []string{"reason"}),
		connectsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "connects_rejected_total",
			Help: "Connection attempts refused before the upgrade, by reason."}, []string{"reason"}),
		httpRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "http_requests_refused_total",
			Help: "HTTP requests refused, and their connections closed, before a handler ran, by reason."}, []string{"reason"}),
		socketsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "sockets_refused_total",
			Help: "Sockets answered and closed at accept, before anything was read, by reason."}, []string{"reason"}),
		heartbeatGap: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "heartbeat_gap_seconds",
			Help:    "Time between consecutive frames of a connection.",
			Buckets: []float64{0.5, 1, 2.5, 5, 7.5, 10, 12.5, 15, 20, 25, 30, 60}}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "expirations_total",
			Help: "Connections ended because nothing was heard within the TTL."}),
		detectionLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "offline_detection_lag_seconds",
			Help:    "How late past its deadline an expired connection was noticed.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10}}),
		graceLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "offline_grace_lag_seconds",
			Help:    "How late past its grace end each offline was decided.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1}}),
		graceStarted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "grace_started_total",
			Help: "Users who lost their last connection and entered the offline grace."}),
		statusExpirations: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "status_expirations_total",
			Help: "User statuses ended by their expires_at (by this node's sweeps)."}),
		graceCancellations: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "grace_cancellations_total",
			Help: "Graces cancelled by a new connection: offline flickers avoided."}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "changes_total",
			Help: "Presence changes received for fan-out, by state."}, []string{"state"}),
		fanout: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "fanout_connections",
			Help:    "Local connections a change was queued for.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9)}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "deliveries_total",
			Help: "Changes written to connections."}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "deliveries_coalesced_total",
			Help: "Queued changes replaced by a newer change of the same user before being written."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "deliveries_dropped_total",
			Help: "Changes not delivered, by reason (stale: not newer than one queued; slow_consumer: the reader was disconnected)."},
			[]string{"reason"}),
		slowDisconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "slow_consumer_disconnects_total",
			Help: "Connections closed because they did not read their changes."}),
		slowConsumers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "slow_consumers",
			Help: "Connections whose socket has not taken the frames written to it: their changes wait, coalesced."}),
		slowCoalesced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "slow_consumer_coalesced_total",
			Help: "Queued changes replaced by a newer change of the same user while the connection's socket was not draining."}),
		slowTimeouts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "slow_consumer_timeouts_total",
			Help: "Connections closed with 1013 because their socket did not drain for the slow-reader timeout."}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "store_operation_seconds",
			Help:    "Latency of store operations, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10)}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "store_errors_total",
			Help: "Store operations that failed, by operation."}, []string{"op"}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "resyncs_total",
			Help: "Catch-ups of every local viewer after the store may have lost events."}),
		resyncDeliveries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "resync_deliveries_total",
			Help: "Changes queued by resyncs: only what differed from what viewers held."}),
		pusherConns: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "pusher_connections",
			Help: "Open Pusher protocol sockets (/app/{key})."}),
		pusherFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pusher_frames_total",
			Help: "Frames received on Pusher sockets, by event (client-event for every client-* event, other for the rest)."}, []string{"event"}),
		pusherSubscribeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pusher_subscription_errors_total",
			Help: "Pusher subscriptions and sign-ins refused, by error type."}, []string{"type"}),
		pusherMemberEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pusher_member_events_total",
			Help: "member_added and member_removed events of presence channels, once per channel and node."}, []string{"event"}),
		pusherDelivered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "pusher_channel_deliveries_total",
			Help: "Channel events (REST triggers, client events) written to Pusher sockets."}),
		pusherREST: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pusher_rest_requests_total",
			Help: "Pusher REST API requests, by HTTP status."}, []string{"status"}),
	}
	reg.MustRegister(m.connections, m.usersOnline, m.heartbeats, m.frames, m.framesRejected,
		m.connectsRejected, m.httpRefused, m.socketsRefused, m.heartbeatGap, m.expirations, m.detectionLag, m.graceLag, m.graceStarted,
		m.graceCancellations, m.statusExpirations, m.changes, m.fanout, m.deliveries, m.coalesced, m.dropped,
		m.slowDisconnects, m.slowConsumers, m.slowCoalesced, m.slowTimeouts, m.storeLatency, m.storeErrors, m.resyncs, m.resyncDeliveries,
		m.pusherConns, m.pusherFrames, m.pusherSubscribeErrors, m.pusherMemberEvents, m.pusherDelivered, m.pusherREST,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: ns}),
	)
	// Every name carries the greendot_ prefix, the Go runtime's too
	// (greendot_go_memstats_heap_alloc_bytes, …).
	prometheus.WrapRegistererWithPrefix(ns+"_", reg).MustRegister(collectors.NewGoCollector())
	// Pre-create label values so dashboards see zeros, not gaps.
	for _, r := range []string{reasonBadRequest, reasonUnknownType, reasonRateLimited, reasonBinary, reasonProtocol} {
		m.framesRejected.WithLabelValues(r)
	}
	for _, s := range []string{"online", "away", "offline"} {
		m.changes.WithLabelValues(s)
	}
	m.httpRefused.WithLabelValues(reasonHeadTooLarge)
	m.httpRefused.WithLabelValues(reasonBodyUnauthorized)
	m.socketsRefused.WithLabelValues(reasonFDLimit)
	m.socketsRefused.WithLabelValues(reasonUnauthenticIP)
	m.dropped.WithLabelValues(reasonStale)
	m.dropped.WithLabelValues(reasonSlow)
	m.heartbeatFrames = m.frames.WithLabelValues(protocol.TypeHeartbeat)
	m.heartbeatErrors = m.storeErrors.WithLabelValues(store.OpHeartbeat)
	return m
}

// ObserveOutcome implements store.Observer.
func (m *metrics) ObserveOutcome(op string, out presence.Outcome, took time.Duration) {
	m.storeLatency.WithLabelValues(op).Observe(took.Seconds())
	m.expirations.Add(float64(len(out.Expired)))
	for _, lag := range out.ExpiryLag {
		m.detectionLag.Observe(lag.Seconds())
	}
	for _, lag := range out.GraceLag {
		m.graceLag.Observe(lag.Seconds())
	}
	m.graceStarted.Add(float64(out.GraceStarted))
	m.graceCancellations.Add(float64(out.GraceCancelled))
	m.statusExpirations.Add(float64(out.StatusesExpired))
}

var _ store.Observer = (*metrics)(nil)
