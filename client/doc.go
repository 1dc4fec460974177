// Package client is the Go client of greendot, the presence server.
//
// Dial connects, waits for the welcome and the snapshot, and from then on
// keeps a local map of the presence of every user the viewer shares a team
// with: Get and All read it, OnChange and Changes report every change
// applied to it. The client heartbeats at the interval the server
// advertises, each gap drawn uniformly from [0.7, 1.0] of it, and reconnects
// by itself: with exponential backoff and full jitter after a drop, after
// the advised delay when the server drains (a reconnect frame, close 1012),
// and at once with a fresh token from Options.TokenFunc after close 4001
// (token expired). The map is version-aware: a snapshot replaces it, a change
// applies only if newer than what the map holds.
//
// # Concurrency
//
// Every method is safe for concurrent use. A Client runs a supervisor
// goroutine (connects, waits, reconnects), a forwarder for Changes, and per
// connection one reader and one writer; Close stops them all and waits.
// OnChange runs on the reader and OnStateChange on the supervisor: both
// must return quickly and must not call Close. Changes never blocks the
// reader: when its reader is slow, the changes waiting for it are coalesced
// to the latest per user.
//
// # Load generation
//
// Options.HeartbeatInterval forces an interval, Options.DisableHeartbeats
// stops automatic heartbeats, Ping measures a heartbeat's round trip,
// Change.Received is the receipt time of each change, and Freeze makes the
// client a hung one (TCP open, nothing sent) for expiry tests.
package client
