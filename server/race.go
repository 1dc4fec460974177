//go:build race

package server

// raceEnabled: see handover.go.
const raceEnabled = true
