package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const healthcheckUsage = `usage: greendot healthcheck [--url URL] [--timeout D]

Exits 0 when URL answers 200 within the timeout; otherwise prints why and
exits 1. For container images without a shell or curl:
HEALTHCHECK CMD ["/greendot", "healthcheck"]. Without --url it checks
/readyz on 127.0.0.1 at the port of GREENDOT_ADDR (serve's --addr from the
environment), else 8080.

flags:
`

// healthcheck asks a node whether it is ready, as a load balancer would.
func healthcheck(args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, healthcheckUsage)
		fs.PrintDefaults()
	}
	target := fs.String("url", "", "the `URL` to check (default http://127.0.0.1:8080/readyz, or GREENDOT_ADDR's port)")
	var timeout time.Duration
	durationVar(fs, &timeout, "timeout", 3*time.Second, "the `duration` to wait for the whole answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("healthcheck: unexpected argument %q", fs.Arg(0))
	}
	if timeout <= 0 {
		return fmt.Errorf("healthcheck: --timeout must be positive, got %v", timeout)
	}
	if *target == "" {
		u, err := readyURL(getenv("GREENDOT_ADDR"))
		if err != nil {
			return fmt.Errorf("healthcheck: %w", err)
		}
		*target = u
	}
	if u, err := url.Parse(*target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("healthcheck: --url %q must be an http:// or https:// URL", *target)
	}

	client := &http.Client{
		Timeout: timeout,
		// A proxy from the environment must not stand between a node and
		// its own health check.
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
	}
	resp, err := client.Get(*target)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			if ue.Timeout() {
				return fmt.Errorf("healthcheck: %s: no answer within %v", *target, timeout)
			}
			err = ue.Err
		}
		return fmt.Errorf("healthcheck: %s: %v", *target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	if resp.StatusCode != http.StatusOK {
		msg := strings.Join(strings.Fields(string(body)), " ")
		return fmt.Errorf("healthcheck: %s answered %s: %s", *target, resp.Status, msg)
	}
	_, err = fmt.Fprintf(stdout, "healthy: %s answered %s\n", *target, resp.Status)
	return err
}

// readyURL is the /readyz URL of a node listening on addr (serve's --addr),
// reached over loopback when addr names no host or every host.
func readyURL(addr string) (string, error) {
	if addr == "" {
		addr = ":8080" // serve's default --addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("GREENDOT_ADDR %q is not host:port: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
