package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"
)

// durationValue is a flag.Value like the flag package's own duration, but
// its error says what is wrong: `--ttl 30` gets "a duration needs a unit",
// not Go's bare "parse error".
type durationValue time.Duration

// durationVar defines a duration flag. Its usage should name its type in
// backquotes ("… for this `duration` …"): help prints that name in place of
// the "value" the flag package gives types it does not know.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationValue)(p), name, usage)
}

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("a duration needs a unit, e.g. %q", s+"s")
		}
		return errors.New("not a duration: give a number and a unit, e.g. 1500ms, 10s, 5m or 720h")
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return time.Duration(*d).String() }

func (d *durationValue) Get() any { return time.Duration(*d) }
