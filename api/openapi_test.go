package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/pusher"
)

func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(OpenAPI)
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
		t.Fatalf("openapi.yaml: version %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(loader.Context, openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3.1 document: %v", err)
	}
	return doc
}

// TestOpenAPIDocument checks the description alone: valid OpenAPI 3.1,
// an operationId on every operation.
func TestOpenAPIDocument(t *testing.T) {
	doc := loadOpenAPI(t)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
		}
	}
}

// apiChecker sends real requests to a node and checks each exchange against
// the OpenAPI description: the request's validity, the status, headers and
// body of the response. It records the operations and statuses it saw.
type apiChecker struct {
	doc    *openapi3.T
	router routers.Router
	n      *node

	mu   sync.Mutex
	seen map[string]map[int]bool // operationId → statuses
}

func newAPIChecker(t *testing.T, doc *openapi3.T, n *node, seen map[string]map[int]bool) *apiChecker {
	t.Helper()
	// Route against the node under test, not the description's default host.
	d := *doc
	d.Servers = openapi3.Servers{{URL: "http://" + n.addr}}
	router, err := gorillamux.NewRouter(&d)
	if err != nil {
		t.Fatal(err)
	}
	return &apiChecker{doc: &d, router: router, n: n, seen: seen}
}

type exchange struct {
	method, path string
	header       http.Header
	body         string
	want         int // the status the test expects
}

// do sends ex and checks it against the operation it matches. A request
// the description refuses must get a 4xx or 5xx, and one it accepts must not
// get a 400: otherwise description and server disagree on what is valid.
func (c *apiChecker) do(t *testing.T, ex exchange) (http.Header, []byte) {
	t.Helper()
	req := c.request(t, ex)
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: not described: %v", ex.method, ex.path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if reqErr == nil && ex.body != "" && !json.Valid([]byte(ex.body)) {
		// The validator decodes the first JSON value and ignores the rest.
		reqErr = errors.New("the body is not one JSON value")
	}
	// ValidateRequest reads the body: send it again.
	req = c.request(t, ex)
	status, header, body := c.roundTrip(t, req)
	where := fmt.Sprintf("%s %s → %d %s", ex.method, ex.path, status, truncate(body))
	if status != ex.want {
		t.Errorf("%s: want %d", where, ex.want)
	}
	switch {
	case reqErr == nil && status == http.StatusBadRequest:
		t.Errorf("%s: the description accepts this request, the server refuses it", where)
	case reqErr != nil && status < 400:
		t.Errorf("%s: the server accepts this request, the description refuses it: %v", where, reqErr)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s: response does not match the description: %v", where, err)
	}
	if resp := route.Operation.Responses.Status(status); resp != nil && len(resp.Value.Content) == 0 && len(body) > 0 {
		t.Errorf("%s: the description has no body for this status", where)
	}
	c.mu.Lock()
	if c.seen[route.Operation.OperationID] == nil {
		c.seen[route.Operation.OperationID] = map[int]bool{}
	}
	c.seen[route.Operation.OperationID][status] = true
	c.mu.Unlock()
	return header, body
}

// doUndescribed sends a request no operation describes (a wrong method, an
// unknown path) and checks the answer against the named component response.
func (c *apiChecker) doUndescribed(t *testing.T, ex exchange, response string) {
	t.Helper()
	req := c.request(t, ex)
	_, _, err := c.router.FindRoute(req)
	var routeErr *routers.RouteError
	if !errors.As(err, &routeErr) {
		t.Fatalf("%s %s: an operation describes it (%v), want none", ex.method, ex.path, err)
	}
	status, header, body := c.roundTrip(t, req)
	where := fmt.Sprintf("%s %s → %d %s", ex.method, ex.path, status, truncate(body))
	if status != ex.want {
		t.Errorf("%s: want %d", where, ex.want)
	}
	ref := c.doc.Components.Responses[response]
	if ref == nil {
		t.Fatalf("no component response %q", response)
	}
	r := ref.Value
	for name, h := range r.Headers {
		v := header.Get(name)
		if v == "" {
			if h.Value.Required {
				t.Errorf("%s: no %s header", where, name)
			}
			continue
		}
		if err := h.Value.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			t.Errorf("%s: header %s: %v", where, name, err)
		}
	}
	mt := r.Content.Get(header.Get("Content-Type"))
	if mt == nil {
		t.Fatalf("%s: Content-Type %q not described by %s", where, header.Get("Content-Type"), response)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if err := mt.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: body does not match %s: %v", where, response, err)
	}
}

func (c *apiChecker) request(t *testing.T, ex exchange) *http.Request {
	t.Helper()
	var body io.Reader = http.NoBody
	if ex.body != "" {
		body = strings.NewReader(ex.body)
	}
	req, err := http.NewRequest(ex.method, c.n.url(ex.path), body)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range ex.header {
		req.Header[k] = vs
	}
	if ex.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

func (c *apiChecker) roundTrip(t *testing.T, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	resp, err := c.n.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp.StatusCode, resp.Header, nil // the body is the WebSocket now
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

func truncate(b []byte) string {
	s, _, _ := strings.Cut(string(bytes.TrimSpace(b)), "\n")
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

func upgradeHeader(key string) http.Header {
	return http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"},
		"Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {key}}
}

const wsKey = "dGhlIHNhbXBsZSBub25jZQ==" // RFC 6455's example key

// TestOpenAPIAgainstServer checks real exchanges with greendot on both
// stores, open and locked (--api-key, --jwt-secret), against openapi.yaml,
// then requires that each described operation was exercised.
func TestOpenAPIAgainstServer(t *testing.T) {
	doc := loadOpenAPI(t)
	seen := map[string]map[int]bool{}
	long := strings.Repeat("x", 129)
	for _, kind := range storeKinds {
		t.Run(kind+"/open", func(t *testing.T) {
			n := startNode(t, kind)
			c := newAPIChecker(t, doc, n, seen)
			for _, ex := range []exchange{
				{method: "PUT", path: "/v1/teams/eng/members/alice", want: 204},
				{method: "PUT", path: "/v1/teams/eng/members/bob", want: 204},
				{method: "PUT", path: "/v1/teams/eng/members/" + long, want: 400},
				{method: "GET", path: "/v1/users/alice/presence", want: 200},
				{method: "GET", path: "/v1/users/" + long + "/presence", want: 400},
				{method: "GET", path: "/v1/teams/eng/presence", want: 200},
				{method: "GET", path: "/v1/teams/" + long + "/presence", want: 400},
				{method: "GET", path: "/v1/connect?user=alice", want: 400},
				{method: "GET", path: "/v1/connect", header: upgradeHeader(wsKey), want: 401},
				{method: "GET", path: "/v1/connect?user=" + long, header: upgradeHeader(wsKey), want: 400},
				{method: "GET", path: "/v1/connect?user=alice&device=", header: upgradeHeader(wsKey), want: 400},
				{method: "GET", path: "/v1/connect?user=alice", header: upgradeHeader("short"), want: 400},
				{method: "GET", path: "/v1/connect?user=alice&token=x", header: upgradeHeader(wsKey), want: 401},
				{method: "GET", path: "/healthz", want: 200},
				{method: "GET", path: "/readyz", want: 200},
				{method: "GET", path: "/metrics", want: 200},
				{method: "GET", path: "/", want: 200},
				{method: "GET", path: "/greendot.js", want: 200},
			} {
				c.do(t, ex)
			}
			badVersion := upgradeHeader(wsKey)
			badVersion.Set("Sec-Websocket-Version", "12")
			h, _ := c.do(t, exchange{method: "GET", path: "/v1/connect?user=alice", header: badVersion, want: 400})
			if h.Get("Sec-Websocket-Version") != "13" {
				t.Errorf("a refused WebSocket version: Sec-WebSocket-Version %q, want 13", h.Get("Sec-Websocket-Version"))
			}

			// A live connection, so that presence bodies carry devices,
			// last_seen and (on Redis) large versions.
			alice := n.dial(t, "user=alice&device=ios", nil)
			alice.readUntil("snapshot")
			c.do(t, exchange{method: "GET", path: "/v1/connect?user=bob&device=web", header: upgradeHeader(wsKey), want: 101})
			c.do(t, exchange{method: "GET", path: "/v1/users/alice/presence", want: 200})
			c.do(t, exchange{method: "GET", path: "/v1/teams/eng/presence", want: 200})
			ids, _ := json.Marshal(make([]string, 501))
			for _, ex := range []exchange{
				{body: `{"user_ids":["alice","bob","nobody","alice"]}`, want: 200},
				{body: `{"user_ids":[]}`, want: 200},
				{body: `{}`, want: 400},
				{body: `{"user_ids":null}`, want: 400},
				{body: `{"user_ids":"alice"}`, want: 400},
				{body: `{"user_ids":[""]}`, want: 400},
				{body: `{"user_ids":` + strings.ReplaceAll(string(ids), `""`, `"u"`) + `}`, want: 400},
				{body: `{"user_ids":[]} {}`, want: 400},
				{body: `[`, want: 400},
				{body: `{"user_ids":["` + strings.Repeat("a", 2<<20) + `"]}`, want: 413},
			} {
				ex.method, ex.path = "POST", "/v1/presence/query"
				c.do(t, ex)
			}
			for _, ex := range []exchange{
				{method: "PUT", path: "/v1/users/alice/status", body: `{"mode":"dnd","text":"In a meeting","emoji":"📅","expires_at":null}`, want: 200},
				{method: "PUT", path: "/v1/users/alice/status", body: `{"mode":"busy"}`, want: 400},
				{method: "PUT", path: "/v1/users/" + long + "/status", body: `{"mode":"dnd"}`, want: 400},
				{method: "DELETE", path: "/v1/users/alice/status", want: 200},
			} {
				c.do(t, ex)
			}
			c.do(t, exchange{method: "DELETE", path: "/v1/teams/eng/members/bob", want: 204})
			c.do(t, exchange{method: "DELETE", path: "/v1/teams/eng/members/" + long, want: 400})

			for _, ex := range []exchange{
				{method: "POST", path: "/healthz", want: 405},
				{method: "POST", path: "/v1/connect", want: 405},
				{method: "GET", path: "/v1/presence/query", want: 405},
				{method: "PATCH", path: "/v1/teams/eng/members/alice", want: 405},
				{method: "DELETE", path: "/metrics", want: 405},
			} {
				c.doUndescribed(t, ex, "MethodNotAllowed")
			}
			c.doUndescribed(t, exchange{method: "GET", path: "/v1/nope", want: 404}, "NotFound")
			c.doUndescribed(t, exchange{method: "POST", path: "/nope", want: 404}, "NotFound")

			if n.redis != nil {
				n.redis.Stop()
				c.do(t, exchange{method: "GET", path: "/v1/users/alice/presence", want: 503})
				c.do(t, exchange{method: "GET", path: "/readyz", want: 503})
			}
			// Draining: /readyz and /v1/connect answer 503 until the port closes.
			n.drain()
			alice.readUntil("reconnect")
			c.do(t, exchange{method: "GET", path: "/readyz", want: 503})
			c.do(t, exchange{method: "GET", path: "/v1/connect?user=bob", header: upgradeHeader(wsKey), want: 503})
		})
		t.Run(kind+"/pusher", func(t *testing.T) {
			n := startNode(t, kind, "--pusher-app-id", "42", "--pusher-key", "pk", "--pusher-secret", "ps")
			c := newAPIChecker(t, doc, n, seen)
			signed := func(secret, method, path, body string, q url.Values) string {
				if q == nil {
					q = url.Values{}
				}
				return path + "?" + pusher.SignRequest("pk", secret, method, path, q, []byte(body), time.Now()).Encode()
			}
			ev := `{"name":"flash","channels":["news","presence-eng"],"data":"{\"x\":1}"}`
			batch := `{"batch":[{"name":"a","channel":"news","data":"1"},{"name":"b","channel":"news","data":"2"}]}`
			userEv := `{"name":"hello","data":"hi"}`
			for _, ex := range []exchange{
				{method: "GET", path: "/app/pk?protocol=7&client=js&version=8.4.0", header: upgradeHeader(wsKey), want: 101},
				{method: "GET", path: "/app/pk?protocol=7", want: 400},
				{method: "POST", path: signed("ps", "POST", "/apps/42/events", ev, nil), body: ev, want: 200},
				{method: "POST", path: signed("wrong", "POST", "/apps/42/events", ev, nil), body: ev, want: 401},
				{method: "POST", path: signed("ps", "POST", "/apps/7/events", ev, nil), body: ev, want: 404},
				{method: "POST", path: signed("ps", "POST", "/apps/42/batch_events", batch, nil), body: batch, want: 200},
				{method: "GET", path: signed("ps", "GET", "/apps/42/channels", "", nil), want: 200},
				{method: "GET", path: signed("ps", "GET", "/apps/42/channels", "", url.Values{"filter_by_prefix": {"presence-"}, "info": {"user_count"}}), want: 200},
				{method: "GET", path: signed("ps", "GET", "/apps/42/channels/presence-eng", "", url.Values{"info": {"user_count"}}), want: 200},
				{method: "GET", path: signed("ps", "GET", "/apps/42/channels/presence-eng/users", "", nil), want: 200},
				{method: "POST", path: signed("ps", "POST", "/apps/42/users/alice/events", userEv, nil), body: userEv, want: 200},
				{method: "POST", path: signed("ps", "POST", "/apps/42/users/alice/terminate_connections", "{}", nil), body: "{}", want: 200},
			} {
				c.do(t, ex)
			}
		})
		t.Run(kind+"/locked", func(t *testing.T) {
			n := startNode(t, kind, "--api-key", "k3y", "--jwt-secret", "s3cret")
			c := newAPIChecker(t, doc, n, seen)
			key := http.Header{"Authorization": {"Bearer k3y"}}
			wrong := http.Header{"Authorization": {"Bearer nope"}}
			token := upgradeHeader(wsKey)
			token.Set("Authorization", "Bearer "+signToken(t, "s3cret", "alice", 0))
			expired := upgradeHeader(wsKey)
			expired.Set("Authorization", "Bearer "+signToken(t, "s3cret", "alice", -time.Hour))
			for _, ex := range []exchange{
				{method: "PUT", path: "/v1/teams/eng/members/alice", want: 401},
				{method: "PUT", path: "/v1/teams/eng/members/alice", header: wrong, want: 401},
				{method: "PUT", path: "/v1/teams/eng/members/alice", header: key, want: 204},
				{method: "GET", path: "/v1/users/alice/presence", want: 401},
				{method: "GET", path: "/v1/users/alice/presence", header: key, want: 200},
				{method: "POST", path: "/v1/presence/query", body: `{"user_ids":["alice"]}`, want: 401},
				{method: "GET", path: "/v1/teams/eng/presence", header: wrong, want: 401},
				{method: "DELETE", path: "/v1/teams/eng/members/alice", want: 401},
				{method: "GET", path: "/healthz", want: 200},
				{method: "GET", path: "/metrics", want: 200},
				{method: "GET", path: "/v1/connect", header: upgradeHeader(wsKey), want: 401},
				{method: "GET", path: "/v1/connect?user=alice", header: upgradeHeader(wsKey), want: 401},
				{method: "GET", path: "/v1/connect", header: expired, want: 401},
				{method: "GET", path: "/v1/connect?device=ios", header: token, want: 101},
				{method: "GET", path: "/v1/connect?token=" + signToken(t, "s3cret", "bob", 0), header: upgradeHeader(wsKey), want: 101},
			} {
				c.do(t, ex)
			}
		})
	}

	var unseen []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if len(seen[op.OperationID]) == 0 {
				unseen = append(unseen, method+" "+path)
			}
		}
	}
	sort.Strings(unseen)
	for _, u := range unseen {
		t.Errorf("%s is described but no test exchange reached it", u)
	}
	var summary []string
	for op, statuses := range seen {
		var ss []string
		for s := range statuses {
			ss = append(ss, fmt.Sprint(s))
		}
		sort.Strings(ss)
		summary = append(summary, op+" "+strings.Join(ss, ","))
	}
	sort.Strings(summary)
	t.Logf("exchanges checked, by operation and status: %s", strings.Join(summary, "; "))
}

// signToken signs an HS256 client token for user; expiresIn < 0 makes it
// expired, 0 gives it no exp.
func signToken(t *testing.T, secret, user string, expiresIn time.Duration) string {
	t.Helper()
	claims := jwt.RegisteredClaims{Subject: user}
	if expiresIn != 0 {
		claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(expiresIn))
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
