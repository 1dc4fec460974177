package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v4"
)

// asyncDoc is asyncapi.yaml with the payload schemas of its messages
// compiled, by frame type and direction.
type asyncDoc struct {
	doc     map[string]any
	sends   map[string]*jsonschema.Schema // server → client frames (replies too), by "type"
	reads   map[string]*jsonschema.Schema // client → server frames, by "type"
	replies map[string][]string           // client frame type → frame types it is answered with
}

const asyncURL = "file:///asyncapi.json"

// loadAsyncAPI parses asyncapi.yaml, checks that its operations, channels
// and messages refer to each other correctly and that every example fits
// its payload, and compiles the payloads. AsyncAPI's default schema format
// is a superset of JSON Schema draft 7, so that is the dialect.
func loadAsyncAPI(t *testing.T) *asyncDoc {
	t.Helper()
	var y any
	if err := yaml.Unmarshal(AsyncAPI, &y); err != nil {
		t.Fatalf("asyncapi.yaml: %v", err)
	}
	// Through JSON, so that numbers and maps are what the validator expects.
	b, err := json.Marshal(y)
	if err != nil {
		t.Fatalf("asyncapi.yaml: %v", err)
	}
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	doc, ok := raw.(map[string]any)
	if !ok || doc["asyncapi"] != "3.0.0" {
		t.Fatalf("asyncapi.yaml: want an AsyncAPI 3.0.0 document, got asyncapi %v", doc["asyncapi"])
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource(asyncURL, doc); err != nil {
		t.Fatal(err)
	}
	a := &asyncDoc{doc: doc, sends: map[string]*jsonschema.Schema{}, reads: map[string]*jsonschema.Schema{},
		replies: map[string][]string{}}

	// message returns the frame type and compiled payload of the channel
	// message a $ref names, checking its examples on the way.
	compiled := map[string]string{} // component message → frame type
	message := func(where string, ref any, channel string) (string, *jsonschema.Schema) {
		r, _ := ref.(map[string]any)["$ref"].(string)
		if !strings.HasPrefix(r, channel+"/messages/") {
			t.Fatalf("%s: message %q is not one of %s's", where, r, channel)
		}
		chMsg := a.resolve(t, where, r)
		comp, _ := chMsg["$ref"].(string)
		if !strings.HasPrefix(comp, "#/components/messages/") {
			t.Fatalf("%s: %s should refer to #/components/messages/…", where, r)
		}
		msg := a.resolve(t, where, comp)
		schema, err := c.Compile(asyncURL + comp + "/payload")
		if err != nil {
			t.Fatalf("%s: payload of %s: %v", where, comp, err)
		}
		payload := msg["payload"].(map[string]any)
		if p, ok := payload["$ref"].(string); ok {
			payload = a.resolve(t, where, p)
		}
		typ, _ := dig(payload, "properties", "type", "const").(string)
		if typ == "" {
			t.Fatalf("%s: the payload of %s has no const type", where, comp)
		}
		if _, done := compiled[comp]; !done {
			examples, _ := msg["examples"].([]any)
			if len(examples) == 0 {
				t.Errorf("%s has no example", comp)
			}
			for i, ex := range examples {
				if err := schema.Validate(dig(ex, "payload")); err != nil {
					t.Errorf("%s: example %d does not fit the payload: %v", comp, i, err)
				}
			}
			compiled[comp] = typ
		}
		return typ, schema
	}

	used := map[string]bool{}
	ops, _ := doc["operations"].(map[string]any)
	for name, o := range ops {
		op := o.(map[string]any)
		where := "operation " + name
		ch, _ := dig(op, "channel", "$ref").(string)
		a.resolve(t, where, ch)
		msgs, _ := op["messages"].([]any)
		if len(msgs) == 0 {
			t.Errorf("%s has no message", where)
		}
		for _, m := range msgs {
			used[m.(map[string]any)["$ref"].(string)] = true
			typ, schema := message(where, m, ch)
			switch op["action"] {
			case "send":
				a.sends[typ] = schema
			case "receive":
				a.reads[typ] = schema
				replies, _ := dig(op, "reply", "messages").([]any)
				for _, r := range replies {
					// A reply is a frame the server sends.
					used[r.(map[string]any)["$ref"].(string)] = true
					rt, rs := message(where+" reply", r, ch)
					a.sends[rt] = rs
					a.replies[typ] = append(a.replies[typ], rt)
				}
			default:
				t.Errorf("%s: action %v, want send or receive", where, op["action"])
			}
		}
	}
	for name := range dig(doc, "channels").(map[string]any) {
		msgs, _ := dig(doc, "channels", name, "messages").(map[string]any)
		for m := range msgs {
			if ref := "#/channels/" + name + "/messages/" + m; !used[ref] {
				t.Errorf("%s is in no operation", ref)
			}
		}
	}
	return a
}

// resolve follows a local $ref ("#/a/b").
func (a *asyncDoc) resolve(t *testing.T, where, ref string) map[string]any {
	t.Helper()
	if !strings.HasPrefix(ref, "#/") {
		t.Fatalf("%s: $ref %q is not local", where, ref)
	}
	var v any = a.doc
	for _, p := range strings.Split(ref[2:], "/") {
		v = dig(v, strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~"))
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: $ref %q does not resolve to an object", where, ref)
	}
	return m
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// check validates one frame against the message of its type in one
// direction, and returns the frame's type.
func check(frames map[string]*jsonschema.Schema, data []byte) (string, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("not JSON: %v", err)
	}
	typ, _ := dig(v, "type").(string)
	schema := frames[typ]
	if schema == nil {
		return typ, fmt.Errorf("no message has type %q", typ)
	}
	if err := schema.Validate(v); err != nil {
		return typ, err
	}
	return typ, nil
}

// TestAsyncAPIDocument checks the description alone.
func TestAsyncAPIDocument(t *testing.T) {
	a := loadAsyncAPI(t)
	if len(a.sends) == 0 || len(a.reads) == 0 {
		t.Fatalf("%d server frames, %d client frames described", len(a.sends), len(a.reads))
	}
}

// TestAsyncAPIAgainstServer reads real frames from greendot on both stores
// and validates each against its message; it sends client frames, valid and
// not, and requires the description and the server to agree on which are
// refused (an error frame). Every described frame must be seen.
func TestAsyncAPIAgainstServer(t *testing.T) {
	a := loadAsyncAPI(t)
	var mu sync.Mutex
	seen, sent := map[string]bool{}, map[string]bool{}
	onFrame := func(t *testing.T, data []byte) {
		t.Helper()
		typ, err := check(a.sends, data)
		if err != nil {
			t.Errorf("server frame %s does not match the description: %v", data, err)
		}
		mu.Lock()
		seen[typ] = true
		mu.Unlock()
	}
	many, _ := json.Marshal(make([]string, 501))
	probes := []string{
		`{"type":"heartbeat"}`,
		`{"type":"heartbeat","id":"a-1"}`,
		`{"type":"heartbeat","id":-1.5e3}`,
		`{"type":"heartbeat","id":null}`,
		`{"type":"heartbeat","id":{}}`,
		`{"type":"heartbeat","id":[1]}`,
		`{"type":"heartbeat","extra":true}`,
		`{"type":"status","state":"online"}`,
		`{"type":"status","state":"busy"}`,
		`{"type":"status"}`,
		`{"type":"query","id":"q1","user_ids":["bob","dave","carol","alice"]}`,
		`{"type":"query","user_ids":[]}`,
		`{"type":"query","id":7}`,
		`{"type":"query","user_ids":"bob"}`,
		`{"type":"query","user_ids":[""]}`,
		`{"type":"query","user_ids":` + strings.ReplaceAll(string(many), `""`, `"u"`) + `}`,
		`{"type":"sttaus","state":"away"}`,
		`{"type":7}`,
		`{}`,
		`[]`,
		`{"type":"heartbeat"`,
		`{"type":"set_status","mode":"busy"}`,
		`{"type":"set_status","mode":"dnd","text":"` + strings.Repeat("x", 101) + `"}`,
		`{"type":"watch","id":"w1","user_ids":["erin","zed"]}`,
		`{"type":"watch","user_ids":[]}`,
		`{"type":"watch","id":"w2","user_ids":"erin"}`,
		`{"type":"watch","id":"w3","user_ids":[""]}`,
		`{"type":"watch","user_ids":` + strings.ReplaceAll(string(many), `""`, `"u"`) + `}`,
		`{"type":"unwatch","user_ids":["erin"]}`,
		`{"type":"unwatch"}`,
		// Last: on Redis its my_status may come after the fence.
		`{"type":"set_status","mode":"dnd","text":"In a meeting","emoji":"📅","expires_at":null}`,
	}
	var agreed []string
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			// big (4 members) is large, eng (3) is not.
			n := startNode(t, kind, "--large-team", "3")
			for _, m := range []string{"eng/members/alice", "eng/members/bob", "eng/members/carol", "ops/members/dave",
				"big/members/alice", "big/members/bob", "big/members/carol", "big/members/erin"} {
				if code, body := n.send(t, "PUT", "/v1/teams/"+m, ""); code != 204 {
					t.Fatalf("PUT %s: %d %s", m, code, body)
				}
			}
			bob := n.dial(t, "user=bob&device=ios", onFrame)
			if f := bob.read(); f["type"] != "welcome" {
				t.Fatalf("first frame %v, want welcome", f)
			}
			if f := bob.read(); f["type"] != "snapshot" {
				t.Fatalf("second frame %v, want snapshot", f)
			}
			alice := n.dial(t, "user=alice", onFrame)
			alice.readUntil("snapshot")
			bob.readUntil("presence")
			carol := n.dial(t, "user=carol&device=desktop", onFrame)
			carol.readUntil("snapshot")

			// Two connections share the probes, to stay inside the rate
			// limit's burst (each probe is followed by a fence).
			for i, p := range probes {
				w := []*wsConn{alice, carol}[i%2]
				accepted := true
				if _, err := check(a.reads, []byte(p)); err != nil {
					accepted = false
				}
				refused, answers := probe(t, w, p, fmt.Sprintf("fence-%d", i))
				if accepted == refused {
					t.Errorf("%s: the description %s it, the server %s it", p, verdict(accepted), verdict(!refused))
				} else if kind == storeKinds[0] {
					agreed = append(agreed, verdict(accepted)+" "+truncate([]byte(p)))
				}
				if accepted {
					typ, _ := check(a.reads, []byte(p))
					for _, ans := range answers {
						if !slices.Contains(a.replies[typ], ans) {
							t.Errorf("%s was answered with %s; the description's replies to %s are %v", p, ans, typ, a.replies[typ])
						}
					}
					mu.Lock()
					sent[typ] = true
					mu.Unlock()
				}
			}
			alice.write(`{"type":"status","state":"away"}`)
			bob.readUntil("presence")
			n.drain()
			for _, w := range []*wsConn{alice, bob, carol} {
				w.readUntil("reconnect")
			}
		})
	}
	t.Logf("client frames, description and server agreeing: %s", strings.Join(agreed, "; "))
	for _, dir := range []struct {
		name     string
		frames   map[string]*jsonschema.Schema
		observed map[string]bool
	}{{"received from the server", a.sends, seen}, {"accepted by the server", a.reads, sent}} {
		var missing []string
		for typ := range dir.frames {
			if !dir.observed[typ] {
				missing = append(missing, typ)
			}
		}
		sort.Strings(missing)
		for _, m := range missing {
			t.Errorf("frame %s is described but was never %s", m, dir.name)
		}
	}
}

func verdict(accepted bool) string {
	if accepted {
		return "accepts"
	}
	return "refuses"
}

// probe sends frame, then a heartbeat with the fence id, and reports
// whether an error frame came back before the fence's ack, and the types of
// the other answers. The server answers a connection's frames in order, so
// whatever frame causes arrives before the ack.
func probe(t *testing.T, w *wsConn, frame, fence string) (refused bool, answers []string) {
	t.Helper()
	w.write(frame)
	w.write(`{"type":"heartbeat","id":"` + fence + `"}`)
	for {
		f := w.read()
		typ, _ := f["type"].(string)
		switch {
		case typ == "error":
			refused = true
		case typ == "heartbeat_ack" && f["id"] == fence:
			return refused, answers
		case typ != "presence" && typ != "team_counts": // a teammate's change, new counts: at any time
			answers = append(answers, typ)
		}
	}
}
