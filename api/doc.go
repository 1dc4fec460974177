// Package api holds greendot's machine-readable interface descriptions:
// openapi.yaml (OpenAPI 3.1, the HTTP API). It is embedded so that tools
// built on greendot can read it without the source tree.
//
// The package's tests keep it true: they start real greendot processes
// (memory store, and Redis with its own redis-server), validate real
// requests and responses against the description, and check that every
// route the server registers is described. They also check that the
// Grafana dashboard in deploy/grafana queries only metrics a server exposes.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of the HTTP API, in YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte
