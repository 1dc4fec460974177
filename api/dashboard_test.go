package api

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
)

const dashboardPath = "../deploy/grafana/greendot.json"

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// query is one PromQL expression of the dashboard and where it is.
type query struct {
	where string
	expr  string
}

func loadDashboard(t *testing.T) (dashboard, []query) {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				qs = append(qs, query{fmt.Sprintf("panel %d %q, target %s", p.ID, p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	return d, qs
}

var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*instance\s*\)$`)

// TestDashboardShape checks what Grafana needs to import the dashboard and
// what makes it usable on any Prometheus: the datasource and instance
// variables, and every query going through them.
func TestDashboardShape(t *testing.T) {
	d, qs := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: panels and variables here need 36 or later (Grafana 9+)", d.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Name {
		case "datasource":
			if v.Type != "datasource" || string(v.Query) != `"prometheus"` {
				t.Errorf("variable datasource: type %q query %s, want a datasource variable of type prometheus", v.Type, v.Query)
			}
		case "instance":
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Fatalf("variable instance: query %s: %v", v.Query, err)
			}
			if v.Type != "query" || !labelValues.MatchString(q.Query) {
				t.Errorf("variable instance: type %q query %q, want a query label_values(<metric>, instance)", v.Type, q.Query)
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("variable instance must query ${datasource}, not %+v", v.Datasource)
			}
		}
	}
	if !vars["datasource"] || !vars["instance"] {
		t.Errorf("variables %v: want datasource and instance", vars)
	}

	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %d %q: gridPos %+v does not fit the 24-column grid", p.ID, p.Title, p.GridPos)
			}
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %d %q: datasource %+v, want uid ${datasource}", p.ID, p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %d %q has no query", p.ID, p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %d %q: refId %q empty or repeated", p.ID, p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %d %q target %s: datasource %+v, want uid ${datasource}", p.ID, p.Title, tg.RefID, tg.Datasource)
				}
			}
		}
	}
	walk(d.Panels)

	for _, q := range qs {
		sels, err := selectors(q.expr)
		if err != nil {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s: %q reads no metric", q.where, q.expr)
		}
		for _, s := range sels {
			if !strings.Contains(s.matchers, `instance=~"$instance"`) {
				t.Errorf("%s: %s{%s} ignores the instance variable: add instance=~\"$instance\"", q.where, s.name, s.matchers)
			}
		}
	}
}

// dashboardMetrics returns every metric name the dashboard reads, with
// where it reads it.
func dashboardMetrics(t *testing.T) map[string][]string {
	t.Helper()
	d, qs := loadDashboard(t)
	used := map[string][]string{}
	for _, v := range d.Templating.List {
		var q struct{ Query string }
		if v.Name == "instance" && json.Unmarshal(v.Query, &q) == nil {
			if m := labelValues.FindStringSubmatch(q.Query); m != nil {
				used[m[1]] = append(used[m[1]], "variable instance")
			}
		}
	}
	for _, q := range qs {
		sels, err := selectors(q.expr)
		if err != nil {
			t.Fatalf("%s: %q: %v", q.where, q.expr, err)
		}
		for _, s := range sels {
			used[s.name] = append(used[s.name], q.where)
		}
	}
	return used
}

// TestDashboardMetricsExist runs greendot on each store, drives enough
// traffic that every labelled metric has a series, and fails for each metric
// the dashboard reads that /metrics does not expose. greendot_redis_* exist
// only with --store redis; everything else must exist on both stores.
func TestDashboardMetricsExist(t *testing.T) {
	used := dashboardMetrics(t)
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			n := startNode(t, kind)
			driveTraffic(t, n)
			if n.redis != nil {
				// Failed Redis operations are counted from the first one on:
				// stop Redis so that greendot_redis_errors_total exists.
				n.redis.Stop()
				testwait.For(t, 10*time.Second, func() error {
					if !n.scrape(t)["greendot_redis_errors_total"] {
						return fmt.Errorf("greendot_redis_errors_total not exposed with Redis down")
					}
					return nil
				})
			}
			exposed := n.scrape(t)
			var missing []string
			for name, where := range used {
				if kind == "memory" && strings.HasPrefix(name, "greendot_redis_") {
					continue
				}
				if !exposed[name] {
					missing = append(missing, fmt.Sprintf("%s (%s)", name, strings.Join(where, "; ")))
				}
			}
			sort.Strings(missing)
			for _, m := range missing {
				t.Errorf("the dashboard reads a metric the server does not expose: %s", m)
			}
			t.Logf("%d metric names read by the dashboard, %d exposed by the %s store", len(used), len(exposed), kind)
		})
	}
}

// driveTraffic gives every labelled metric and histogram a sample: two team
// mates connect, heartbeat, change status, query, send a bad frame, and one
// connect is refused.
func driveTraffic(t *testing.T, n *node) {
	t.Helper()
	for _, u := range []string{"alice", "bob"} {
		if code, body := n.send(t, "PUT", "/v1/teams/eng/members/"+u, ""); code != 204 {
			t.Fatalf("PUT member %s: %d %s", u, code, body)
		}
	}
	if code, _ := n.send(t, "GET", "/v1/connect?user=carol&device=%00", ""); code != 400 {
		t.Fatalf("connect with a bad device: %d, want 400", code)
	}
	bob := n.dial(t, "user=bob", nil)
	bob.readUntil("snapshot")
	alice := n.dial(t, "user=alice&device=ios", nil)
	alice.readUntil("snapshot")
	bob.readUntil("presence")
	alice.write(`{"type":"heartbeat","id":1}`)
	alice.readUntil("heartbeat_ack")
	alice.write(`{"type":"status","state":"away"}`)
	bob.readUntil("presence")
	alice.write(`{"type":"query","id":"q","user_ids":["bob"]}`)
	alice.readUntil("query_result")
	alice.write(`{"type":"nope"}`)
	alice.readUntil("error")
	alice.write(`{"type":"heartbeat","id":2}`)
	alice.readUntil("heartbeat_ack")
	alice.close()
	bob.close()
}
