package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one measured value.
type Figure struct {
	Key   string  // snake_case, the unit in the name where it has one
	Label string  // for the table
	Value float64 // NaN when it could not be measured
	Unit  string  // for the table: "ms", "KiB", "/s", "µs", "" …
	Goal  string  // the performance goal, e.g. "≤ 20 ms"; "" when none
	Met   *bool   // whether the goal holds; nil when there is none
}

// Result is what a run measured.
type Result struct {
	Scenario string
	RunID    string
	Targets  []string
	Params   map[string]any
	Started  time.Time
	Elapsed  time.Duration
	Figures  []Figure
	Notes    []string
}

func newResult(scenario string, o *Options) *Result {
	p := map[string]any{"n": o.N, "procs": o.Procs, "team_size": o.TeamSize, "grace_s": o.Grace.Seconds(), "protocol": o.Protocol}
	if o.Peer {
		p["peer"] = true
	}
	switch scenario {
	case "idle", "heartbeat", "churn":
		p["duration_s"] = o.Duration.Seconds()
	}
	switch scenario {
	case "heartbeat", "churn":
		p["rate"] = o.Rate
	case "fanout":
		p["rounds"] = o.Rounds
	case "largeteam":
		p["rounds"], p["offline_members"] = o.Rounds, o.OfflineMembers
	case "storm", "expiry":
		p["window_s"] = o.Window.Seconds()
	}
	return &Result{Scenario: scenario, RunID: o.RunID, Targets: o.Targets, Params: p, Started: time.Now()}
}

// Figure returns the figure with key, if measured.
func (r *Result) Figure(key string) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Key == key {
			return f, true
		}
	}
	return Figure{}, false
}

func (r *Result) add(key, label string, v float64, unit string) {
	r.Figures = append(r.Figures, Figure{Key: key, Label: label, Value: v, Unit: unit})
}

// addDur adds a duration in milliseconds.
func (r *Result) addDur(key, label string, d time.Duration) {
	r.add(key+"_ms", label, float64(d)/float64(time.Millisecond), "ms")
}

// goal sets the goal of the latest figure: it is met when value ≤ limit
// (or ≥ limit when atLeast).
func (r *Result) goal(limit float64, atLeast bool, text string) {
	f := &r.Figures[len(r.Figures)-1]
	met := !math.IsNaN(f.Value) && (f.Value <= limit && !atLeast || f.Value >= limit && atLeast)
	f.Goal, f.Met = text, &met
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// WriteTable writes the figures as an aligned table.
func (r *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	name := r.Scenario
	if p, _ := r.Params["protocol"].(string); p != "" && p != protoNative {
		name += " --protocol " + p
	}
	fmt.Fprintf(&b, "greendot bench %s · run %s · %s · n=%v · %s\n", name, r.RunID,
		joinTargets(r.Targets), r.Params["n"], r.Elapsed.Round(time.Second))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  figure\tvalue\tgoal\t")
	for _, f := range r.Figures {
		mark := ""
		if f.Met != nil {
			mark = "  ok"
			if !*f.Met {
				mark = "  MISSED"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s%s\t\n", f.Label, formatValue(f.Value, f.Unit), f.Goal, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	var s string
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e15:
		s = groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	case a >= 100:
		s = groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	}
	if unit == "" {
		return s
	}
	if unit[0] == '/' || unit == "%" {
		return s + unit
	}
	return s + " " + unit
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// MarshalJSON writes the result as one object: results maps each key to
// its value (null when not measured), goals each goal's text and outcome.
func (r *Result) MarshalJSON() ([]byte, error) {
	type goal struct {
		Goal string `json:"goal"`
		Met  bool   `json:"met"`
	}
	results := make(map[string]any, len(r.Figures))
	goals := map[string]goal{}
	for _, f := range r.Figures {
		if math.IsNaN(f.Value) || math.IsInf(f.Value, 0) {
			results[f.Key] = nil
		} else {
			results[f.Key] = f.Value
		}
		if f.Met != nil {
			goals[f.Key] = goal{f.Goal, *f.Met}
		}
	}
	notes := r.Notes
	if notes == nil {
		notes = []string{}
	}
	return json.Marshal(struct {
		Scenario string          `json:"scenario"`
		RunID    string          `json:"run_id"`
		Targets  []string        `json:"targets"`
		Params   map[string]any  `json:"params"`
		Started  time.Time       `json:"started"`
		ElapsedS float64         `json:"elapsed_s"`
		Results  map[string]any  `json:"results"`
		Goals    map[string]goal `json:"goals"`
		Notes    []string        `json:"notes"`
	}{r.Scenario, r.RunID, r.Targets, r.Params, r.Started.UTC().Truncate(time.Second),
		math.Round(r.Elapsed.Seconds()*10) / 10, results, goals, notes})
}

// WriteJSON writes the result as one line of JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// serverFigures adds what every scenario reports from a pair of scrapes:
// the servers' CPU over the window, and their memory at its end; those a
// peer's sample lacks are left out.
func (r *Result) serverFigures(before, after Sample) {
	if after.Has(mCPU) {
		r.add("server_cpu_s", "server CPU in the window", after.Get(mCPU)-before.Get(mCPU), "s")
	}
	if after.Has(mRSS) {
		r.add("server_rss_mib", "server RSS at the end", after.Get(mRSS)/(1<<20), "MiB")
	}
	if after.Has(mHeap) {
		r.add("server_heap_mib", "server Go heap at the end", after.Get(mHeap)/(1<<20), "MiB")
	}
	if d := after.Sum(mSlow) - before.Sum(mSlow); d > 0 {
		r.note("the servers disconnected %.0f slow consumers", d)
	}
	if d := after.Get(mRejected+`{reason="rate_limited"}`) - before.Get(mRejected+`{reason="rate_limited"}`); d > 0 {
		r.note("the servers rate-limited %.0f frames", d)
	}
}
