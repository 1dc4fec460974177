// Package api holds greendot's machine-readable interface descriptions and
// the tests that keep them true against real greendot processes (memory
// store, and Redis with its own redis-server). It also checks that the
// Grafana dashboard in deploy/grafana queries only metrics a server exposes.
package api
