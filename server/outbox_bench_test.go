package server

import (
	"strconv"
	"testing"

	"github.com/greendot/greendot/protocol"
)

// BenchmarkOutboxPush queues changes of 100 subjects on a connection that
// is not flushed: after the first round every push replaces a queued
// change (presence is state, not a log), the steady state of a slow reader.
func BenchmarkOutboxPush(b *testing.B) {
	c := &client{srv: socketlessServer()}
	subjects := make([]string, 100)
	for i := range subjects {
		subjects[i] = "user-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.push(protocol.Change{UserID: subjects[i%len(subjects)], State: protocol.StateOnline, Version: uint64(i + 1), At: 1764500000000}, false)
	}
}
