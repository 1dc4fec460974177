package pusher

// Error codes of pusher:error frames and WebSocket close frames, Pusher's
// list. 4000-4099: do not reconnect unchanged; 4100-4199: reconnect after
// backing off; 4200-4299: reconnect at once; 4300-4399: other errors.
const (
	CodeSSLOnly               = 4000 // the application only accepts wss://
	CodeAppNotFound           = 4001 // application does not exist
	CodeAppDisabled           = 4003 // application disabled
	CodeOverConnectionQuota   = 4004 // application is over its connection quota
	CodePathNotFound          = 4005 // path not found
	CodeInvalidVersion        = 4006 // invalid version string format
	CodeUnsupportedProtocol   = 4007 // unsupported protocol version
	CodeNoProtocol            = 4008 // no protocol version supplied
	CodeUnauthorized          = 4009 // connection is unauthorized
	CodeOverCapacity          = 4100 // over capacity
	CodeReconnect             = 4200 // generic reconnect immediately
	CodePongNotReceived       = 4201 // a ping was sent and no pong came back
	CodeClosedAfterInactivity = 4202 // closed after inactivity
	CodeClientEventRateLimit  = 4301 // client event rejected due to rate limit
)

// Protocol versions accepted at /app/{key}?protocol=. pusher-js 8 sends 7;
// 5 and 6 differ from 7 only in what the server may omit.
const (
	MinProtocol = 5
	MaxProtocol = 7
)

// CheckProtocol judges the protocol query parameter of a connection. It
// returns ok for MinProtocol..MaxProtocol and otherwise the code to close
// with: CodeNoProtocol when q is empty, CodeInvalidVersion when q is not a
// decimal number, CodeUnsupportedProtocol for any other number.
func CheckProtocol(q string) (code int, ok bool) {
	if q == "" {
		return CodeNoProtocol, false
	}
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c < '0' || c > '9' {
			return CodeInvalidVersion, false
		}
		if n <= MaxProtocol { // stop growing once it is too big to matter
			n = n*10 + int(c-'0')
		}
	}
	if n < MinProtocol || n > MaxProtocol {
		return CodeUnsupportedProtocol, false
	}
	return 0, true
}
