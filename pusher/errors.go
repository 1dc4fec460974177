package pusher

import "errors"

// Sentinel errors; the functions wrap them with the detail.
var (
	ErrBadFrame       = errors.New("pusher: bad frame")
	ErrBadChannelData = errors.New("pusher: bad channel_data")
	ErrBadUserData    = errors.New("pusher: bad user_data")
)
