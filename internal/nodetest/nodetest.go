// Package nodetest runs the greendot command in the tests of other packages:
// built once per test binary, served on a free port of 127.0.0.1, killed
// with the test. Only _test.go files import it, so nothing of it reaches
// the product's builds.
package nodetest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// Main is a TestMain for tests that run greendot: it builds ./cmd/greendot
// into a temporary directory, sets *bin to the binary's path, runs the tests
// under goleak's leak check (with opts) and exits with their result once the
// directory is removed. A failed build ends the run before any test.
func Main(m *testing.M, bin *string, opts ...goleak.Option) {
	dir, err := os.MkdirTemp("", "greendot-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *bin, err = Build(dir); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// goleak exits the process itself; Cleanup is the last chance to remove dir.
	opts = append(opts, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
	goleak.VerifyTestMain(m, opts...)
}

// Build builds ./cmd/greendot of the module the test runs in into dir and
// returns the binary's path.
func Build(dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("go build ./cmd/greendot: not inside the greendot module (GOMOD=%q)", gomod)
	}
	bin := filepath.Join(dir, "greendot")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/greendot")
	cmd.Dir = filepath.Dir(gomod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/greendot: %w\n%s", err, out)
	}
	return bin, nil
}

// FreeAddr is a TCP address of 127.0.0.1 free right now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// SyncBuffer is a bytes.Buffer a process may write while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Node is one `greendot serve` process.
type Node struct {
	Name string // names it in failures and above its log
	Addr string // host:port it serves on
	Cmd  *exec.Cmd
	Done chan struct{} // closed when the process has exited
	Log  *SyncBuffer   // its stdout and stderr
}

// Start runs `bin serve --addr <a free port> flags...` as a child that dies
// with the test binary, and waits up to 10 s until GET /readyz answers 200;
// the test fails if the process exits first. At t's cleanup the process is
// killed and, if t failed, its log printed under "log of <name>".
func Start(t testing.TB, bin, name string, flags ...string) *Node {
	t.Helper()
	return StartUnder(t, nil, bin, name, flags...)
}

// StartUnder is Start with the command run by wrapper, a command that execs
// its arguments (such as prlimit --nofile=256 --), so that the process it
// starts is greendot itself.
func StartUnder(t testing.TB, wrapper []string, bin, name string, flags ...string) *Node {
	t.Helper()
	n := &Node{Name: name, Addr: FreeAddr(t), Done: make(chan struct{}), Log: &SyncBuffer{}}
	argv := append(append(append([]string(nil), wrapper...), bin, "serve", "--addr", n.Addr), flags...)
	n.Cmd = exec.Command(argv[0], argv[1:]...)
	n.Cmd.Stdout, n.Cmd.Stderr = n.Log, n.Log
	n.Cmd.SysProcAttr = redistest.DieWithParent()
	if err := n.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.Cmd.Wait(); close(n.Done) }()
	t.Cleanup(func() {
		n.Kill()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, n.Log.String())
		}
	})
	// A transport of its own, closed once ready: no idle connection of it
	// outlives the test for goleak to find.
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 3 * time.Second}
	defer hc.CloseIdleConnections()
	testwait.For(t, 10*time.Second, func() error {
		select {
		case <-n.Done:
			t.Fatalf("%s exited at start: %s", name, n.Log.String())
		default:
		}
		resp, err := hc.Get("http://" + n.Addr + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s not ready: %d %s", name, resp.StatusCode, body)
		}
		return nil
	})
	return n
}

// Kill ends the process at once, like a crash, and waits for its exit.
func (n *Node) Kill() {
	select {
	case <-n.Done:
		return
	default:
	}
	_ = n.Cmd.Process.Kill()
	<-n.Done
}
