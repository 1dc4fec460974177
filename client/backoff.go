package client

import (
	"math/rand/v2"
	"time"
)

// backoffDelay is the wait before reconnect attempt n (0 for the first after
// a drop): "full jitter", uniform in [0, min(max, base·2ⁿ)), so that clients
// dropped together do not come back together.
func backoffDelay(base, max time.Duration, attempt int) time.Duration {
	ceiling := base
	for i := 0; i < attempt && ceiling < max; i++ {
		ceiling *= 2
	}
	if ceiling > max {
		ceiling = max
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling)
}

// heartbeatGap is the wait before the next heartbeat: uniform in
// [0.7, 1.0]·interval, drawn afresh every time, so that clients started
// together drift apart instead of beating in waves.
func heartbeatGap(interval time.Duration) time.Duration {
	low := interval * 7 / 10
	spread := interval - low
	if spread <= 0 {
		return interval
	}
	return low + rand.N(spread+1)
}
