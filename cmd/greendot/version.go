package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set when linking a release: -ldflags "-X main.version=v1.2.3"
// (scripts/release). Empty otherwise, and the module version is used.
var version string

type buildVersion struct {
	Version string // the release version, the module version, or "devel"
	Commit  string // the VCS revision, "-dirty" when the tree had changes; "unknown"
	Go      string // the toolchain and the target, e.g. "go1.26.0 linux/amd64"
}

// readVersion says what built this binary. linked (the -X value) wins over
// the module version: vX.Y.Z for `go install …@vX.Y.Z`, a pseudo-version or
// "(devel)" for a build in a checkout. "(devel)" is reported as "devel"; a
// release always has a linked version.
func readVersion(linked string, bi *debug.BuildInfo, ok bool) buildVersion {
	v := buildVersion{Version: "devel", Commit: "unknown", Go: runtime.Version()}
	if ok {
		if bi.GoVersion != "" {
			v.Go = bi.GoVersion
		}
		if m := bi.Main.Version; m != "" && m != "(devel)" {
			v.Version = m
		}
		var rev string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			v.Commit = rev
			if dirty {
				v.Commit += "-dirty"
			}
		}
	}
	if linked != "" {
		v.Version = linked
	}
	v.Go += " " + runtime.GOOS + "/" + runtime.GOARCH
	return v
}

// printVersion is `greendot version` and `greendot --version`.
func printVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version: unexpected argument %q", args[0])
	}
	bi, ok := debug.ReadBuildInfo()
	v := readVersion(version, bi, ok)
	_, err := fmt.Fprintf(stdout, "greendot %s\ncommit: %s\ngo: %s\n", v.Version, v.Commit, v.Go)
	return err
}
