package webhook_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/hooktest"
)

// The webhooks a Sender sends verify with the standardwebhooks npm package
// (testdata/verify-js, pinned by its package-lock.json), run by node: a
// second implementation of the standard, in another language.
func TestSignaturesVerifyWithStandardWebhooksJS(t *testing.T) {
	for _, bin := range []string{"node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: this test verifies webhooks with the standardwebhooks npm package; install Node.js 20+ and npm (apt-get install -y nodejs npm)", bin)
		}
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "verify.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata", "verify-js", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	install := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}

	r := newRig(t, 100, nil)
	r.conn(t, "c1", "ünïcødé user")
	r.conn(t, "c2", "bob")
	got := r.waitDelivered(t, 2)
	type req struct {
		Body    string            `json:"body"`
		Headers map[string]string `json:"headers"`
	}
	var reqs []req
	for _, h := range got {
		hs := map[string]string{}
		for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
			hs[k] = h.Header.Get(k)
		}
		reqs = append(reqs, req{Body: h.Body, Headers: hs})
	}
	// A tampered body must fail, or the check proves nothing.
	reqs = append(reqs, req{Body: strings.Replace(reqs[1].Body, `"online"`, `"offline"`, 1), Headers: reqs[1].Headers})
	in, _ := json.Marshal(reqs)
	cmd := exec.Command("node", "verify.mjs", hooktest.Secret)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node verify.mjs: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("verifier said:\n%s", out)
	}
	for i, h := range got {
		want := fmt.Sprintf("ok presence.changed %s %d", h.Data.UserID, h.Data.Version)
		if lines[i] != want {
			t.Fatalf("request %d: verifier said %q, want %q", i, lines[i], want)
		}
	}
	if !strings.HasPrefix(lines[2], "fail") {
		t.Fatalf("a tampered body verified: %q", lines[2])
	}
}
