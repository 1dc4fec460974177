// Package pusher holds the rules of the Pusher Channels protocol, version 7,
// that greendot speaks to pusher-js 8 and Laravel Echo clients, and the
// signatures of the official Pusher server SDKs' REST calls.
//
// It is pure: functions and types only, no goroutines and no I/O. The server
// owns the connections and calls these to name channels, check auth strings,
// read and write frames and verify signed requests.
//
// The references are Pusher's own documents: the Channels protocol
// (library_auth_reference/pusher-websockets-protocol), the auth signatures
// (library_auth_reference/auth-signatures) and the HTTP API's authentication
// (library_auth_reference/rest-api). The tests hold their worked examples.
package pusher
