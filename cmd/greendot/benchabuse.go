package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/greendot/greendot/loadgen"
)

const abuseUsage = `usage: greendot bench abuse [flags]

Floods one node with hostile clients, one flood after the other, each for
--phase: unfinished huge headers, big bodies without the API key, one
user's connections sending 500-id queries without reading, ping floods,
and idle sockets that never send a byte. A bystander heartbeats throughout.
Prints, per flood, the node's CPU, its highest RSS and the bystander's
heartbeat ack p99. Without --url it starts a node of its own (this binary,
memory store, dev mode, a random --api-key) and reads its peak RSS from
/proc. The bystander runs in a process of its own (this binary), so its
acks are not delayed by the floods' goroutines; --bystander-inline runs it
among them, as before.

flags:
`

func benchAbuse(args []string, stdout, stderr io.Writer) error {
	var o loadgen.AbuseOptions
	fs := flag.NewFlagSet("bench abuse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, abuseUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.URL, "url", "", "the node to flood, http://host:port; empty: start one")
	fs.IntVar(&o.Conns, "conns", 200, "sockets per flood (the query flood: at most 20, one user's cap)")
	fs.IntVar(&o.Idle, "idle", 2000, "sockets of the idle flood")
	durationVar(fs, &o.Phase, "phase", 10*time.Second, "the `duration` of each flood")
	fs.StringVar(&o.JWTSecret, "jwt-secret", "", "the node's --jwt-secret, to sign tokens; or GREENDOT_JWT_SECRET (unset: dev mode)")
	floods := fs.String("floods", "", "comma-separated floods to run, of "+strings.Join(loadgen.AbusePhases(), ",")+"; empty: all")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	inline := fs.Bool("bystander-inline", false, "run the bystander in this process, among the floods (its acks then wait on their goroutines too)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench abuse: unexpected argument %q", fs.Arg(0))
	}
	if o.JWTSecret == "" {
		o.JWTSecret = os.Getenv("GREENDOT_JWT_SECRET")
	}
	if *floods != "" {
		o.Floods = strings.Split(*floods, ",")
	}
	if !*quiet {
		o.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var nodeLog *lockedBuffer
	if o.URL == "" {
		if o.JWTSecret != "" {
			return errors.New("bench abuse: --jwt-secret is for a node given by --url; the node it starts runs in dev mode")
		}
		url, pid, log, stopNode, err := startAbuseNode(ctx)
		if err != nil {
			return err
		}
		defer stopNode()
		o.URL, o.PID, nodeLog = url, pid, log
	}
	if !*inline {
		by, stopBy, err := startBystander(ctx, o.URL, o.JWTSecret)
		if err != nil {
			return err
		}
		defer stopBy()
		o.Bystander = by
	}
	res, err := loadgen.Abuse(ctx, o)
	if res != nil && nodeLog != nil {
		out := nodeLog.String()
		res.Notes = append(res.Notes, fmt.Sprintf("the node logged %d lines", strings.Count(out, "\n")))
		if strings.Contains(out, "too many open files") {
			res.Notes = append(res.Notes, "the node logged 'too many open files'")
		}
	}
	if res != nil && len(res.Figures) > 0 {
		if werr := errors.Join(res.WriteTable(stdout), res.WriteJSON(stdout)); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// abuseBystanderCmd is the hidden `greendot bench` subcommand that runs the
// abuse bench's bystander: loadgen.ServeBystander on stdin and stdout.
const abuseBystanderCmd = "abuse-bystander"

func benchAbuseBystander(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench "+abuseBystanderCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the node, http://host:port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The secret comes in the environment, not on a command line others can read.
	return loadgen.ServeBystander(context.Background(), *url, os.Getenv("GREENDOT_JWT_SECRET"), os.Stdin, os.Stdout)
}

// childBystander is a loadgen.Bystander in a child process (this binary):
// a line on its stdin asks for the phase's figures, one line back holds them.
type childBystander struct {
	in  io.WriteCloser
	out *bufio.Reader
}

func (b *childBystander) Mark() (loadgen.BystanderStats, error) {
	if _, err := io.WriteString(b.in, "mark\n"); err != nil {
		return loadgen.BystanderStats{}, fmt.Errorf("bench abuse: the bystander process: %w", err)
	}
	line, err := b.out.ReadBytes('\n')
	if err != nil {
		return loadgen.BystanderStats{}, fmt.Errorf("bench abuse: the bystander process: %w", err)
	}
	return loadgen.DecodeBystanderStats(line)
}

// startBystander starts the bystander's process and waits for its first
// answer, which says it is connected. stop ends it and waits.
func startBystander(ctx context.Context, url, jwtSecret string) (loadgen.Bystander, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("bench abuse: %w", err)
	}
	cmd := exec.Command(exe, "bench", abuseBystanderCmd, "--url", url)
	cmd.Env = append(os.Environ(), "GREENDOT_JWT_SECRET="+jwtSecret)
	var errOut lockedBuffer
	cmd.Stderr = &errOut
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("bench abuse: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("bench abuse: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bench abuse: start the bystander: %w", err)
	}
	// Closing stdin ends it; a kill backs that up if ctx ends first.
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	b := &childBystander{in: in, out: bufio.NewReader(out)}
	end := func() {
		_ = in.Close()
		_ = cmd.Wait()
		stop()
	}
	if _, err := b.Mark(); err != nil {
		end()
		return nil, nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(errOut.String()))
	}
	return b, end, nil
}

// startAbuseNode runs `greendot serve` (this binary) on a free port of
// 127.0.0.1 and waits up to 10 s for it to be ready.
func startAbuseNode(ctx context.Context) (url string, pid int, log *lockedBuffer, stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", 0, nil, nil, fmt.Errorf("bench abuse: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, nil, fmt.Errorf("bench abuse: %w", err)
	}
	addr := l.Addr().String()
	l.Close()
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	log = &lockedBuffer{}
	cmd := exec.Command(exe, "serve", "--addr", addr, "--api-key", hex.EncodeToString(key), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return "", 0, nil, nil, fmt.Errorf("bench abuse: start a node: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	hc := &http.Client{Transport: &http.Transport{}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return "http://" + addr, cmd.Process.Pid, log, stop, nil
			}
		}
		select {
		case <-exited:
			return "", 0, nil, nil, fmt.Errorf("bench abuse: the node exited at start:\n%s", log.String())
		case <-ctx.Done():
			stop()
			return "", 0, nil, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", 0, nil, nil, fmt.Errorf("bench abuse: the node was not ready within 10 s:\n%s", log.String())
		}
	}
}

// lockedBuffer is a bytes.Buffer a child process writes while we read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
