package server

import "sync"

// The accept loop hands each connection to an nbio poller goroutine through
// the kernel (epoll) and code built without race instrumentation, so the
// race detector cannot see that the accepted connection was written before
// the poller reads it, and reports a race that cannot happen. Under -race
// only, a mutex taken on both sides makes that ordering visible. Production
// builds skip it.
var handoverMu sync.Mutex

func handover() {
	if !raceEnabled {
		return
	}
	handoverMu.Lock()
	handoverMu.Unlock() //nolint:staticcheck // an empty critical section is the point
}
