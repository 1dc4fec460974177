package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
)

// With GREENDOT_TEST_MAIN=1 the test binary is the greendot command: tests
// run it as a child to see what a user sees on stdout, stderr and the exit
// code, including what libraries write to os.Stderr behind our back.
func TestMain(m *testing.M) {
	if os.Getenv("GREENDOT_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type run struct {
	stdout, stderr string
	code           int
}

// runGreendot runs the command in a child process with args and extra env.
// Keep an in-process serve from running meanwhile: see TestHealthcheckExitCodes.
func runGreendot(t *testing.T, env []string, args ...string) run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	// A -race child otherwise sleeps a second before it exits.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), "GREENDOT_TEST_MAIN=1", "GORACE="+gorace), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := run{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("greendot %q: %v", args, err)
	}
	return r
}

// freeAddr is a loopback address nothing listens on (at the moment).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestRedisDownIsOneClearLine(t *testing.T) {
	r := runGreendot(t, nil, "serve", "--addr", freeAddr(t), "--store", "redis", "--redis-url", "redis://"+freeAddr(t))
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if r.code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "greendot: redisstore: reach ") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and only greendot's own error", r.code, r.stderr)
	}
}

func TestDurationWithoutUnitNamesTheUnit(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"serve", "--heartbeat-interval", "5"}, `flag -heartbeat-interval: a duration needs a unit, e.g. "5s"`},
		{nil, []string{"serve", "--ttl=1.5"}, `a duration needs a unit, e.g. "1.5s"`},
		{[]string{"GREENDOT_OFFLINE_GRACE=3"}, []string{"serve"}, `GREENDOT_OFFLINE_GRACE="3": a duration needs a unit, e.g. "3s"`},
		{nil, []string{"serve", "--ttl", "soon"}, "not a duration: give a number and a unit"},
		{nil, []string{"token", "--secret", "k", "--user", "a", "--ttl", "60"}, `a duration needs a unit, e.g. "60s"`},
		{nil, []string{"bench", "idle", "--duration", "60"}, `a duration needs a unit, e.g. "60s"`},
		{nil, []string{"healthcheck", "--timeout", "2"}, `a duration needs a unit, e.g. "2s"`},
	} {
		r := runGreendot(t, c.env, c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, "parse error") {
			t.Errorf("%v %q: exit %d, stderr:\n%s\nwant %q", c.env, c.args, r.code, r.stderr, c.want)
		}
	}
	// 0 needs no unit, and help still names the type.
	var o serveOptions
	if err := parseWithEnv(serveFlags(&o), []string{"--forget-after", "0"}, func(string) string { return "" }); err != nil || o.forgetAfter != 0 {
		t.Errorf("--forget-after 0: %v, %v", o.forgetAfter, err)
	}
	var help bytes.Buffer
	fs := serveFlags(&o)
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if !strings.Contains(help.String(), "-ttl duration") || !strings.Contains(help.String(), "(default 25s)") {
		t.Errorf("serve -h:\n%s", help.String())
	}
}

// startServe runs serve in this process until the returned stop is called;
// stop returns serve's error and how long it took to return.
func startServe(t *testing.T, args ...string) (addr string, stop func() (error, time.Duration)) {
	t.Helper()
	addr = freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer // written by serve only, read after it returned
	go func() { done <- serve(ctx, append([]string{"--addr", addr}, args...), &logs) }()
	stopped := false
	stop = func() (error, time.Duration) {
		stopped = true
		start := time.Now()
		cancel()
		select {
		case err := <-done:
			return err, time.Since(start)
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not return within 30s of its context's end")
			return nil, 0
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	testwait.For(t, 10*time.Second, func() error {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("serve returned early: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	return addr, stop
}

func TestIdleServerStopsAtOnce(t *testing.T) {
	_, stop := startServe(t)
	err, took := stop()
	if err != nil {
		t.Fatal(err)
	}
	// The drain holds a node with clients for its 3 s spread; with none
	// there is nobody to wait for.
	if took > 2*time.Second {
		t.Fatalf("an idle server took %v to stop, want well under the 3s drain spread", took)
	}
}
