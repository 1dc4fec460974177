// Package testwait waits in tests for a condition that becomes true by
// itself (a change delivered, a node gone), without timed assertions.
package testwait

import (
	"testing"
	"time"
)

// For polls f until it returns nil or d has passed, then fails the test
// with f's last error.
func For(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(15 * time.Millisecond)
	}
}
