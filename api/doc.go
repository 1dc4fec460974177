// Package api holds greendot's machine-readable interface descriptions:
// openapi.yaml (OpenAPI 3.1, the HTTP API) and asyncapi.yaml (AsyncAPI 3.0,
// the WebSocket frames). They are embedded so that tools built on greendot
// can read them without the source tree.
//
// The package's tests keep them true: they start real greendot processes
// (memory store, and Redis with its own redis-server), validate real
// requests, responses and frames against the descriptions, and check that
// every route the server registers is described. They also check that the
// Grafana dashboard in deploy/grafana queries only metrics a server exposes.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of the HTTP API, in YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte

// AsyncAPI is the AsyncAPI 3.0 description of the WebSocket protocol, in YAML.
//
//go:embed asyncapi.yaml
var AsyncAPI []byte
