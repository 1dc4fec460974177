package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestReadVersion(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.modified", Value: modified}}
	}
	target := " " + runtime.GOOS + "/" + runtime.GOARCH
	for _, c := range []struct {
		name   string
		linked string
		bi     *debug.BuildInfo
		ok     bool
		want   buildVersion
	}{
		{"release", "v1.2.0", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}, Settings: vcs("abc123", "false")},
			true, buildVersion{"v1.2.0", "abc123", "go1.26.1" + target}},
		{"dirty release", "v1.2.0-3-gabc123-dirty", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}, Settings: vcs("abc123", "true")},
			true, buildVersion{"v1.2.0-3-gabc123-dirty", "abc123-dirty", "go1.26.1" + target}},
		{"linked wins over module", "v2.0.0", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.9.0"}},
			true, buildVersion{"v2.0.0", "unknown", "go1.26.1" + target}},
		{"go install @version", "", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.2.0"}},
			true, buildVersion{"v1.2.0", "unknown", "go1.26.1" + target}},
		{"checkout without vcs", "", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}},
			true, buildVersion{"devel", "unknown", "go1.26.1" + target}},
		{"no build info", "", nil, false, buildVersion{"devel", "unknown", runtime.Version() + target}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := readVersion(c.linked, c.bi, c.ok); got != c.want {
				t.Fatalf("readVersion = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestVersionCommands(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		r := runGreendot(t, nil, arg)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "greendot ") || !strings.Contains(r.stdout, "\ngo: "+runtime.Version()) ||
			strings.Contains(r.stdout, "(devel)") {
			t.Errorf("greendot %s: exit %d\n%s%s", arg, r.code, r.stdout, r.stderr)
		}
	}
	if r := runGreendot(t, nil, "version", "extra"); r.code != 1 || !strings.Contains(r.stderr, `unexpected argument "extra"`) {
		t.Errorf("version extra: exit %d, %s", r.code, r.stderr)
	}
}

// A binary linked the way scripts/release links one prints the version it
// was given, and the commit it was built from.
func TestVersionLinkedIntoABuild(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found on PATH: this test builds the command (install Go 1.26+): %v", err)
	}
	bin := filepath.Join(t.TempDir(), "greendot")
	build := exec.Command(gobin, "build", "-buildvcs=auto", "-ldflags", "-X main.version=v0.0.0-linktest", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	// The commit is a revision when built in a git checkout (as here, unless
	// the tests run from an export), "unknown" otherwise.
	want := regexp.MustCompile(`^greendot v0\.0\.0-linktest\ncommit: ([0-9a-f]{40}(-dirty)?|unknown)\ngo: go1\.\S+ ` +
		runtime.GOOS + `/` + runtime.GOARCH + `\n$`)
	if !want.Match(out) {
		t.Fatalf("--version printed:\n%s", out)
	}
	if _, err := exec.LookPath("git"); err == nil && exec.Command("git", "rev-parse", "--git-dir").Run() == nil &&
		strings.Contains(string(out), "commit: unknown") {
		t.Fatalf("built in a git checkout, yet no commit:\n%s", out)
	}
}
