package protocol_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/greendot/greendot/protocol"
)

// Frame encoding and decoding, the per-delivery and per-heartbeat work of
// the server, with the sizes that occur: one change, a batch, a snapshot of
// a team of 100.

func changes(n int) []protocol.Change {
	out := make([]protocol.Change, n)
	for i := range out {
		out[i] = protocol.Change{UserID: "user-" + strconv.Itoa(i), State: protocol.StateOnline, Version: uint64(i + 7), At: 1764500000000 + int64(i)}
	}
	return out
}

func BenchmarkEncodeFrame(b *testing.B) {
	users := make([]protocol.UserState, 99)
	for i := range users {
		users[i] = protocol.UserState{UserID: "user-" + strconv.Itoa(i), State: protocol.StateOnline, Version: 3}
	}
	frames := []struct {
		name  string
		frame any
	}{
		{"presence_1", protocol.Presence{Type: protocol.TypePresence, Changes: changes(1)}},
		{"presence_32", protocol.Presence{Type: protocol.TypePresence, Changes: changes(32)}},
		{"heartbeat_ack", protocol.HeartbeatAck{Type: protocol.TypeHeartbeatAck, ID: json.RawMessage("1234")}},
		{"welcome", protocol.Welcome{Type: protocol.TypeWelcome, ConnectionID: "0123456789abcdef", UserID: "alice", HeartbeatIntervalMS: 10000, TTLMS: 25000}},
		{"snapshot_99", protocol.Snapshot{Type: protocol.TypeSnapshot, Users: users}},
	}
	for _, f := range frames {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				data, err := json.Marshal(f.frame)
				if err != nil {
					b.Fatal(err)
				}
				n = len(data)
			}
			b.SetBytes(int64(n))
		})
	}
}

func BenchmarkDecodeClientFrame(b *testing.B) {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "user-" + strconv.Itoa(i)
	}
	query, _ := json.Marshal(protocol.Query{Type: protocol.TypeQuery, ID: json.RawMessage(`"q1"`), UserIDs: ids})
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"heartbeat", []byte(`{"type":"heartbeat"}`)},
		{"heartbeat_id", []byte(`{"type":"heartbeat","id":1234}`)},
		{"status", []byte(`{"type":"status","state":"away"}`)},
		{"query_100", query},
	} {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(f.data)))
			for b.Loop() {
				if _, err := protocol.DecodeClientFrame(f.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendFrame is the server's encoding of the frames it writes
// most, beside BenchmarkEncodeFrame's json.Marshal of the same, into a
// buffer sized as the server sizes it.
func BenchmarkAppendFrame(b *testing.B) {
	users := make([]protocol.UserState, 99)
	for i := range users {
		users[i] = protocol.UserState{UserID: "user-" + strconv.Itoa(i), State: protocol.StateOnline, Version: 3}
	}
	one := protocol.Presence{Type: protocol.TypePresence, Changes: changes(1)}
	batch := protocol.Presence{Type: protocol.TypePresence, Changes: changes(32)}
	snap := protocol.Snapshot{Type: protocol.TypeSnapshot, Users: users}
	for _, f := range []struct {
		name   string
		encode func() []byte
	}{
		{"presence_1", func() []byte { return protocol.AppendPresence(make([]byte, 0, protocol.PresenceSize(one)), one) }},
		{"presence_32", func() []byte { return protocol.AppendPresence(make([]byte, 0, protocol.PresenceSize(batch)), batch) }},
		{"snapshot_99", func() []byte { return protocol.AppendSnapshot(make([]byte, 0, protocol.SnapshotSize(snap)), snap) }},
	} {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				n = len(f.encode())
			}
			b.SetBytes(int64(n))
		})
	}
}
