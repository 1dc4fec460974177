package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
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
