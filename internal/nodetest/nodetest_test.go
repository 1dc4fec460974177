package nodetest

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

var binary string

func TestMain(m *testing.M) { Main(m, &binary) }

func TestStartServesUntilKilled(t *testing.T) {
	n := Start(t, binary, "greendot", "--store", "memory", "--log-level", "warn")
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 3 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + n.Addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz after Start: %s, want 200", resp.Status)
	}
	n.Kill()
	select {
	case <-n.Done:
	default:
		t.Fatal("Done still open after Kill")
	}
	n.Kill() // already gone: returns at once
}

// A process that exits at start fails the test with its log, not with the
// readiness wait's timeout. Run in a child test binary, whose failure is the
// point.
func TestStartFailsWhenTheProcessExits(t *testing.T) {
	if os.Getenv("NODETEST_EARLY_EXIT") == "1" {
		Start(t, binary, "badflag", "--no-such-flag")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartFailsWhenTheProcessExits$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NODETEST_EARLY_EXIT=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child passed; output:\n%s", out)
	}
	if !strings.Contains(string(out), "badflag exited at start") || !strings.Contains(string(out), "no-such-flag") {
		t.Fatalf("want the early exit reported with the log; output:\n%s", out)
	}
}
