package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func check(args []string, env map[string]string) (string, error) {
	var stdout bytes.Buffer
	err := healthcheck(args, &stdout, &bytes.Buffer{}, func(k string) string { return env[k] })
	return stdout.String(), err
}

func TestHealthcheckAgainstAServingNode(t *testing.T) {
	addr, stop := startServe(t)
	if out, err := check([]string{"--url", "http://" + addr + "/readyz"}, nil); err != nil || !strings.Contains(out, "200") {
		t.Fatalf("ready node: %q, %v", out, err)
	}
	// Without --url the port comes from GREENDOT_ADDR, as serve's does.
	_, port, _ := net.SplitHostPort(addr)
	if _, err := check(nil, map[string]string{"GREENDOT_ADDR": ":" + port}); err != nil {
		t.Fatalf("GREENDOT_ADDR=:%s: %v", port, err)
	}
	if err, _ := stop(); err != nil {
		t.Fatal(err)
	}
	_, err := check([]string{"--url", "http://" + addr + "/readyz"}, nil)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("stopped node: %v, want connection refused", err)
	}
}

func TestHealthcheckFailures(t *testing.T) {
	unready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"unavailable","message":"draining"}}` + "\n"))
	}))
	defer unready.Close()
	// Accepts connections and never answers: the timeout must end the wait.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--url", unready.URL + "/readyz"}, nil, `answered 503 Service Unavailable: {"error":{"code":"unavailable","message":"draining"}}`},
		{[]string{"--url", "http://" + mute.Addr().String() + "/readyz", "--timeout", "200ms"}, nil, "no answer within 200ms"},
		{[]string{"--url", "http://" + freeAddr(t) + "/readyz"}, nil, "connection refused"},
		{[]string{"--url", "127.0.0.1:8080/readyz"}, nil, "must be an http:// or https:// URL"},
		{[]string{"--timeout", "0s"}, nil, "--timeout must be positive"},
		{[]string{"stray"}, nil, `unexpected argument "stray"`},
		{nil, map[string]string{"GREENDOT_ADDR": "8080"}, `GREENDOT_ADDR "8080" is not host:port`},
	} {
		_, err := check(c.args, c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("healthcheck %q %v: %v, want one line with %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHealthcheckDefaultURLMatchesServe(t *testing.T) {
	var o serveOptions
	fs := serveFlags(&o)
	def, err := readyURL("")
	if err != nil || def != "http://127.0.0.1"+fs.Lookup("addr").DefValue+"/readyz" {
		t.Fatalf("default %q (%v) does not match serve's --addr %q", def, err, fs.Lookup("addr").DefValue)
	}
	for addr, want := range map[string]string{
		"0.0.0.0:9000":  "http://127.0.0.1:9000/readyz",
		"[::]:9000":     "http://127.0.0.1:9000/readyz",
		"10.0.0.5:9000": "http://10.0.0.5:9000/readyz",
		"[::1]:9000":    "http://[::1]:9000/readyz",
	} {
		if got, err := readyURL(addr); err != nil || got != want {
			t.Errorf("readyURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}

func TestHealthcheckExitCodes(t *testing.T) {
	// Not an in-process greendot: nbio's descriptors lack close-on-exec, so
	// a child started beside it inherits them and can cost a connection.
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		}
	}))
	defer ready.Close()
	_, port, _ := net.SplitHostPort(ready.Listener.Addr().String())
	if r := runGreendot(t, []string{"GREENDOT_ADDR=:" + port}, "healthcheck"); r.code != 0 || r.stderr != "" {
		t.Errorf("ready: exit %d, %s", r.code, r.stderr)
	}
	r := runGreendot(t, []string{"GREENDOT_ADDR=" + freeAddr(t)}, "healthcheck")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "greendot: healthcheck: http://127.0.0.1:") {
		t.Errorf("nothing listening: exit %d, stderr %q", r.code, r.stderr)
	}
}
