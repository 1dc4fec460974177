package webhook

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a Sender's Prometheus collectors (docs/webhooks.md).
type Metrics struct {
	deliveries *prometheus.CounterVec
	attempts   *prometheus.CounterVec
	retries    prometheus.Counter
	depth      prometheus.Gauge
	oldest     prometheus.Gauge
}

// NewMetrics makes the collectors, every label value present from the start
// so that rates and alerts see zeros rather than nothing.
func NewMetrics() *Metrics { return newMetrics("greendot_webhook_", "Webhook") }

// NewPusherMetrics makes the collectors of the Sender of Pusher-format
// webhooks: the same as NewMetrics', named greendot_pusher_webhook_*, so
// that each receiver's failures show apart.
func NewPusherMetrics() *Metrics { return newMetrics("greendot_pusher_webhook_", "Pusher webhook") }

func newMetrics(prefix, what string) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "deliveries_total",
			Help: what + " events finished, by outcome: delivered (a 2xx), expired (dropped after --webhook-retry-for), overflow (dropped from a full --webhook-queue).",
		}, []string{"outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "attempts_total",
			Help: what + " requests made, by result: success, non_2xx, timeout, error (no answer).",
		}, []string{"result"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "retries_total",
			Help: "Failed " + strings.ToLower(what) + " attempts that were scheduled to be retried.",
		}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "queue_depth",
			Help: what + " events not delivered yet (on Redis: of the whole cluster, as seen by this node).",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "oldest_event_age_seconds",
			Help: "Age of the oldest " + strings.ToLower(what) + " event not delivered yet; 0 when none.",
		}),
	}
	for _, o := range []string{"delivered", "expired", "overflow"} {
		m.deliveries.WithLabelValues(o)
	}
	for _, r := range []string{"success", "non_2xx", "timeout", "error"} {
		m.attempts.WithLabelValues(r)
	}
	return m
}

// Collectors lists the collectors, to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.deliveries, m.attempts, m.retries, m.depth, m.oldest}
}
