package main

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

func gogcNow() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// serve tunes the collector (internal/gctune, from 50) unless GOGC is set,
// leaves an operator's GOGC alone, and puts back what it found when it
// returns.
func TestServeSetsGOGCUnlessTheEnvironmentDoes(t *testing.T) {
	old := debug.SetGCPercent(80)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	t.Setenv("GOGC", "80")
	_, stop := startServe(t)
	if p := gogcNow(); p != 80 {
		t.Fatalf("GOGC=80 in the environment, and serve set %d", p)
	}
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}

	t.Setenv("GOGC", "")
	_, stop = startServe(t)
	if p := gogcNow(); p != 50 {
		t.Fatalf("GOGC %d without GOGC in the environment, want 50", p)
	}
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	if p := gogcNow(); p != 80 {
		t.Fatalf("GOGC %d after serve returned, want the 80 it found", p)
	}
}
