package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/greendot/greendot/loadgen"
)

func TestBenchFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{nil, "name a scenario"},
		{[]string{"nap"}, "unknown scenario"},
		{[]string{"idle", "extra"}, `unexpected argument "extra"`},
		{[]string{"idle", "--procs", "1", "--n", "40000"}, "--procs 3"},
		{[]string{"idle", "--worker", "3/2"}, "must be i/n"},
		{[]string{"--n", "5", "idle", "--target", "http://x"}, "must be ws://"},
	} {
		var stdout, stderr bytes.Buffer
		err := bench(c.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("bench %q: err = %v, want %q", c.args, err, c.err)
		}
	}
	var stderr bytes.Buffer
	if err := bench([]string{"-h"}, &bytes.Buffer{}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "storm") {
		t.Errorf("-h: %v\n%s", err, stderr.String())
	}
}

// A short abuse run against the node it starts: every flood runs and is
// reported, with the node's peak RSS read from /proc.
func TestBenchAbuseRunsEveryFlood(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1") // the node it starts is this binary
	var stdout, stderr bytes.Buffer
	if err := bench([]string{"abuse", "--conns", "5", "--idle", "20", "--phase", "1s", "--quiet"}, &stdout, &stderr); err != nil {
		t.Fatalf("bench abuse: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var out struct {
		Results map[string]*float64 `json:"results"`
		Notes   []string            `json:"notes"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("last line is not the JSON result: %v\n%s", err, stdout.String())
	}
	for _, p := range append([]string{"quiet"}, loadgen.AbusePhases()...) {
		for _, k := range []string{"_server_cpu_s", "_rss_peak_mib", "_bystander_acks"} {
			if v, ok := out.Results[p+k]; !ok || v == nil {
				t.Errorf("no %s%s in %s", p, k, lines[len(lines)-1])
			}
		}
	}
	if v := out.Results["server_rss_peak_mib"]; v == nil || *v <= 0 {
		t.Errorf("server_rss_peak_mib = %v, want the node's VmHWM", v)
	}
	if !strings.Contains(stdout.String(), "bystander heartbeat ack p99") {
		t.Errorf("no table:\n%s", stdout.String())
	}
}

func TestBenchPeerFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"idle", "--server-pid", "12,x"}, `"x" is not a process id`},
		{[]string{"idle", "--server-pid", "0"}, `"0" is not a process id`},
		{[]string{"idle", "--peer"}, "--peer needs --protocol pusher"},
	} {
		var stdout, stderr bytes.Buffer
		err := bench(c.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("bench %q: err = %v, want %q", c.args, err, c.err)
		}
	}
	var l []int
	if err := (pidList{&l}).Set("12, 34"); err != nil || len(l) != 2 || l[1] != 34 || (pidList{&l}).String() != "12,34" {
		t.Errorf("pidList = %v, %v", l, err)
	}
}
