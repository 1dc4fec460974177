package redisstore

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/store"
)

// storeMetrics are the Redis store's own metrics; the server registers them
// through Collectors. Labels are closed sets.
type storeMetrics struct {
	scriptLatency *prometheus.HistogramVec
	pipelineSize  prometheus.Histogram
	pubsubLag     prometheus.Histogram
	sweeps        prometheus.Counter
	reassertions  prometheus.Counter
	crashesTold   prometheus.Counter
	// lostRepliesTold: resyncs of every node asked for after lost replies.
	lostRepliesTold prometheus.Counter
	published       prometheus.Counter
	errors          *prometheus.CounterVec
	up              prometheus.Gauge
}

func newStoreMetrics() *storeMetrics {
	const ns, sub = "greendot", "redis"
	return &storeMetrics{
		scriptLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "script_seconds", Help: "Latency of Redis scripts and batches, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 10)}, []string{"op"}),
		pipelineSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "heartbeat_batch_size", Help: "Heartbeats written per shard batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8)}),
		pubsubLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "pubsub_lag_seconds", Help: "From a change in Redis to its receipt on this node.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12)}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "sweeps_total", Help: "Sweeps of every shard run by this node."}),
		reassertions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "reassertions_total", Help: "Live connections written back into Redis after it lost them."}),
		crashesTold: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "crashes_told_total", Help: "Crashed nodes (found dead, or this node's own earlier process) this node told every node to resync for."}),
		lostRepliesTold: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "lost_replies_told_total", Help: "Times this node told every node to resync after writes whose reply was lost (they may have landed unpublished)."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "published_total", Help: "Change messages published (one per team of the subject)."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "errors_total", Help: "Failed Redis operations, by operation."}, []string{"op"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "up", Help: "1 while Redis answers this node, else 0."}),
	}
}

var _ store.MetricsSource = (*Store)(nil)

// Collectors implements store.MetricsSource.
func (s *Store) Collectors() []prometheus.Collector {
	m := s.m
	return []prometheus.Collector{m.scriptLatency, m.pipelineSize, m.pubsubLag, m.sweeps,
		m.reassertions, m.crashesTold, m.lostRepliesTold, m.published, m.errors, m.up}
}
