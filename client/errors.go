package client

import "errors"

var (
	// ErrClosed is returned by calls on a Client that was closed.
	ErrClosed = errors.New("client: closed")
	// ErrFrozen is returned by calls that would send while the client is
	// frozen (see Client.Freeze).
	ErrFrozen = errors.New("client: frozen")
	// ErrDisconnected is returned when the connection a request was sent on
	// ended before the reply came. The client reconnects by itself; the
	// request may be retried.
	ErrDisconnected = errors.New("client: disconnected before the reply")
	// ErrUnauthorized means the server refused the token (or the dev-mode
	// user) with 401 before the upgrade.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrProtocol means the server sent something the protocol does not
	// allow where it was sent, such as a first frame other than welcome.
	ErrProtocol = errors.New("client: protocol violation")
	// ErrServerSilent ends a connection on which nothing arrived for the
	// server's ttl although heartbeats asked for acks: the server or the
	// path to it is gone without a close.
	ErrServerSilent = errors.New("client: server silent")
	// ErrWriteTimeout ends a connection on which a frame could not be
	// written within Options.WriteTimeout: the server stopped reading, or
	// the path to it is stuck.
	ErrWriteTimeout = errors.New("client: write timed out")
)
