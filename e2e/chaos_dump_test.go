package e2e

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"time"
)

// dump writes the whole record of a run (faults, memberships, every
// device's connections, statuses and applied changes, every entry on the
// wire) to path, times relative to the start of the faults, so that a
// violation can be followed step by step.
func (o *oracle) dump(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b := bufio.NewWriter(f)
	defer b.Flush()
	at := func(t time.Time) string {
		if t.IsZero() {
			return "open"
		}
		return o.at(t)
	}
	fmt.Fprintf(b, "chaos %s seed %d, faults from %s (+0) to %s, judged to %s\n\n", o.w.cfg.topology, o.w.cfg.seed,
		o.from.Format("15:04:05.000"), at(o.w.end), at(o.to))
	fmt.Fprintf(b, "violations (%d):\n", len(o.all))
	for _, v := range o.all {
		fmt.Fprintf(b, "  %s\n", v)
	}
	fmt.Fprintln(b, "\nfaults:")
	for _, fw := range o.w.faults {
		fmt.Fprintf(b, "  %s..%s %s node=%q redis=%v %s\n", at(fw.from), at(fw.to), fw.kind, fw.node, fw.redis, fw.detail)
	}
	fmt.Fprintln(b, "\nmemberships:")
	for _, s := range o.w.spans {
		fmt.Fprintf(b, "  %s %s %s..%s (sure %s..%s)\n", s.team, s.user, at(s.from), at(s.to), at(s.joined), at(s.leaving))
	}
	devs := slices.Clone(o.devs)
	slices.SortFunc(devs, func(a, b *devCopy) int {
		if a.user != b.user {
			if a.user < b.user {
				return -1
			}
			return 1
		}
		return a.d.id - b.d.id
	})
	for _, dc := range devs {
		fmt.Fprintf(b, "\ndevice %s:\n", dc)
		if dc.dialErr != nil {
			fmt.Fprintf(b, "  first connect failed: %v\n", dc.dialErr)
		}
		if !dc.closedAt.IsZero() {
			fmt.Fprintf(b, "  closed for good %s\n", at(dc.closedAt))
		}
		for _, a := range dc.attempts {
			fmt.Fprintf(b, "  attempt %s..%s node=%s ok=%v\n", at(a.from), at(a.to), a.node, a.ok)
		}
		for _, s := range dc.sessions {
			fmt.Fprintf(b, "  session %s..%s node=%s end=%q\n", at(s.start), at(s.end), s.node, s.endKind)
		}
		for _, fr := range dc.freezes {
			fmt.Fprintf(b, "  frozen %s..%s\n", at(fr.from), at(fr.to))
		}
		for _, st := range dc.statuses {
			fmt.Fprintf(b, "  status %s %s\n", at(st.at), st.state)
		}
		for _, ch := range dc.changes {
			atS := "-"
			if !ch.At.IsZero() {
				atS = at(ch.At)
			}
			fmt.Fprintf(b, "  applied %s %s %s→%s v%d at=%s snapshot=%v\n", at(ch.Received), ch.UserID, ch.Previous, ch.State, ch.Version, atS, ch.FromSnapshot)
		}
		for _, rc := range dc.raws {
			rc.mu.Lock()
			fmt.Fprintf(b, "  conn to %s dialed %s upgraded=%v reconnect=%s close=%s\n", rc.node, at(rc.dialed), rc.upgraded, at(rc.reconnect), at(rc.closeRecv))
			for _, e := range rc.entries {
				kind := "presence"
				if e.snapshot {
					kind = "snapshot"
				}
				atS := "-"
				if e.at != 0 {
					atS = at(time.UnixMilli(e.at))
				}
				fmt.Fprintf(b, "    %s %s %s=%s v%d at=%s\n", at(e.recv), kind, e.user, e.state, e.version, atS)
			}
			rc.mu.Unlock()
		}
	}
	return nil
}
