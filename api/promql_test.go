package api

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// selector is one metric a PromQL expression reads, with the text of its
// label matchers ("" when it has none).
type selector struct {
	name     string
	matchers string
}

type promToken struct {
	kind string // "ident", "(", ")", "{…}", "op"
	text string
}

// selectors returns the metrics a PromQL expression (as a Grafana panel
// writes it, with $variables) reads. It is a lexer, not a parser: it knows
// enough of PromQL to tell metric names from functions, aggregations,
// keywords, label lists and strings, and it refuses unbalanced brackets and
// unterminated strings. Good enough to check a dashboard; no substitute for
// Prometheus's parser.
func selectors(expr string) ([]selector, error) {
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	var out []selector
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		if tk.kind != "ident" {
			continue
		}
		next := promToken{}
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch strings.ToLower(tk.text) {
		case "by", "without", "on", "ignoring", "group_left", "group_right":
			// A label list, not an expression: skip it.
			if next.kind == "(" {
				depth := 0
				for i++; i < len(toks); i++ {
					if toks[i].kind == "(" {
						depth++
					} else if toks[i].kind == ")" {
						if depth--; depth == 0 {
							break
						}
					}
				}
			}
			continue
		case "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan":
			continue
		}
		if next.kind == "(" {
			continue // a function or an aggregation
		}
		if n := strings.ToLower(next.text); next.kind == "ident" && (n == "by" || n == "without") {
			continue // an aggregation with its grouping first: sum by (le) (…)
		}
		s := selector{name: tk.text}
		if next.kind == "{…}" {
			s.matchers = next.text
		}
		out = append(out, s)
	}
	return out, nil
}

func lex(expr string) ([]promToken, error) {
	var toks []promToken
	depth := 0
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			toks = append(toks, promToken{"op", expr[i:end]})
			i = end
		case c == '{' || c == '[':
			closer := map[byte]byte{'{': '}', '[': ']'}[c]
			j := i + 1
			for ; j < len(expr) && expr[j] != closer; j++ {
				if q := expr[j]; q == '"' || q == '\'' || q == '`' {
					end, err := skipString(expr, j)
					if err != nil {
						return nil, err
					}
					j = end - 1
				} else if q == '{' || q == '[' || q == '}' || q == ']' {
					return nil, fmt.Errorf("unexpected %q inside %q at byte %d", q, c, j)
				}
			}
			if j == len(expr) {
				return nil, fmt.Errorf("unclosed %q at byte %d", c, i)
			}
			if c == '{' {
				toks = append(toks, promToken{"{…}", expr[i+1 : j]})
			} else {
				toks = append(toks, promToken{"op", expr[i : j+1]})
			}
			i = j + 1
		case c == '}' || c == ']':
			return nil, fmt.Errorf("unexpected %q at byte %d", c, i)
		case c == '(':
			depth++
			toks = append(toks, promToken{"(", "("})
			i++
		case c == ')':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("unbalanced ')' at byte %d", i)
			}
			toks = append(toks, promToken{")", ")"})
			i++
		case c == '$':
			// A Grafana variable: $name or ${name}.
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				for j < len(expr) && expr[j] != '}' {
					j++
				}
				j++
			} else {
				for j < len(expr) && isIdentByte(expr[j], false) {
					j++
				}
			}
			toks = append(toks, promToken{"op", expr[i:j]})
			i = j
		case isIdentByte(c, true):
			j := i
			for j < len(expr) && isIdentByte(expr[j], false) {
				j++
			}
			toks = append(toks, promToken{"ident", expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdentByte(expr[j], false) || expr[j] == '.') {
				j++
			}
			toks = append(toks, promToken{"op", expr[i:j]})
			i = j
		default:
			toks = append(toks, promToken{"op", string(c)})
			i++
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("%d unclosed '('", depth)
	}
	return toks, nil
}

// skipString returns the index just past the string literal at expr[i].
func skipString(expr string, i int) (int, error) {
	q := expr[i]
	for j := i + 1; j < len(expr); j++ {
		if expr[j] == '\\' && q != '`' {
			j++
			continue
		}
		if expr[j] == q {
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at byte %d", i)
}

func isIdentByte(c byte, first bool) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':' {
		return true
	}
	return !first && c >= '0' && c <= '9'
}

func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []selector
		err  string
	}{
		{expr: `greendot_connections`, want: []selector{{"greendot_connections", ""}}},
		{expr: `sum by (instance) (greendot_connections{instance=~"$instance"})`,
			want: []selector{{"greendot_connections", `instance=~"$instance"`}}},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(greendot_heartbeat_gap_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`,
			want: []selector{{"greendot_heartbeat_gap_seconds_bucket", `instance=~"$instance"`}}},
		{expr: `sum(rate(a_sum[5m])) / sum(rate(a_count[5m])) > 0.5 and on (instance) b == 0 or vector(0)`,
			want: []selector{{"a_sum", ""}, {"a_count", ""}, {"b", ""}}},
		{expr: `sum without (op) (x{op="a}b", y='c{'}) offset 5m # b_total`,
			want: []selector{{"x", `op="a}b", y='c{'`}}},
		{expr: `1 - sum(rate(x{le="25"}[10m])) / sum(rate(y[10m]))`, want: []selector{{"x", `le="25"`}, {"y", ""}}},
		{expr: `sum(rate(x[5m])`, err: "unclosed"},
		{expr: `rate(x[5m]))`, err: "unbalanced"},
		{expr: `x{a="b}`, err: "unterminated"},
		{expr: `x{a="b"`, err: "unclosed"},
		{expr: `x[5m`, err: "unclosed"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := selectors(tc.expr)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
