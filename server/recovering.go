package server

import (
	"net/http"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// msgRecovering is the error of a read refused after the store lost its
// data: until every node has written its connections back, an answer would
// show their users offline.
const msgRecovering = "store recovering from a data loss; retry in a few seconds"

// intact is nil unless the store is recovering from a data loss (see
// store.LossGuard).
func (s *Server) intact() error {
	if g, ok := s.store.(store.LossGuard); ok {
		return g.Intact()
	}
	return nil
}

// refuseRecovering is the HTTP answer to a read while the store recovers.
func refuseRecovering(w http.ResponseWriter) error {
	w.Header().Set("Retry-After", "1")
	return &httpError{status: http.StatusServiceUnavailable, code: protocol.CodeUnavailable, message: msgRecovering}
}
