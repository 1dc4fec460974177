// Package presence holds greendot's presence rules: how connections make a
// user online, away or offline, and when a change is published.
//
// It is the pure core of the server. A Tracker has no goroutines, does no I/O
// and never reads the wall clock: every method takes the current time, and
// returns the changes it caused. Callers serialise access (a Tracker is not
// safe for concurrent use) and own the timing: they call Advance often enough
// for deadlines to be met.
//
// The rules (DESIGN.md, "Semantics"):
//   - a user is online while at least one connection is live; the state is
//     online if any device is active, away if all are idle;
//   - a connection is live while it is heard from within the TTL;
//   - when the last connection ends the user stays as they were for the
//     offline grace; a new connection in that window cancels it silently;
//   - every observable change increments the user's version;
//   - a user's status (SetUserStatus) applies to all their devices: mode
//     dnd shows an online or away user as DND, mode invisible shows them
//     offline; its text and emoji are shown too, until it is replaced or
//     its expiry passes (Advance resets it to auto). Every difference in
//     what viewers see (Look) is one change with a new version;
//   - a user offline for Config.ForgetAfter is forgotten (reported as never
//     seen); versions start above every forgotten user's, so one who comes
//     back still publishes newer versions than viewers hold.
//
// The Redis store implements the same rules in Lua; the store conformance
// suite checks that both agree.
package presence
