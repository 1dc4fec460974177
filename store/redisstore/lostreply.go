package redisstore

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
)

// noteLostReply marks that a write's reply may be lost: err is neither
// Redis's answer (a refusal that ran nothing, such as CLUSTERDOWN, is one)
// nor a failure to connect or to get a connection, which sent nothing. The
// write may have landed, here or when a held connection delivers it, and
// what it changed was published by nobody: a status change stays unseen,
// an online written and never shown is followed by an offline (chaos seed
// 643529765). Retrying the write does not help: it finds nothing to change.
// Once Redis answers, the health check has every node resync
// (tellLostReply).
func (s *Store) noteLostReply(err error) {
	if replyLost(err) {
		s.replyLost.Store(true)
	}
}

// replyLost reports whether a write that failed with err may have run in
// Redis. A timeout after the write left is a read's *net.OpError (the
// context's deadline set on the socket); a bare context error is go-redis
// giving up while waiting for a connection, which sent nothing, and so is
// a failed dial.
func replyLost(err error) bool {
	var re redis.Error
	var oe *net.OpError
	switch {
	case err == nil, errors.As(err, &re), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, redis.ErrClosed):
		return false
	case errors.As(err, &oe):
		return oe.Op != "dial"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return false
	}
	return true // a connection closed under the call (EOF), and the like
}

// mayTellLostReply tells every node to resync (tellLostReply) if a reply
// was lost and the last such tell was lostReplyEvery ago (told); it
// reports whether it told. Not while Redis is unhealthy, nor while a data
// loss's hold-off runs: a resync then would read the users not written
// back yet as gone (its own resync follows).
func (s *Store) mayTellLostReply(told *time.Time) bool {
	if !s.healthy.Load() || s.awaitingResync.Load() || !s.replyLost.Load() || time.Since(*told) < lostReplyEvery {
		return false
	}
	s.replyLost.Store(false)
	*told = time.Now()
	// Its own deadline: the health check's may be spent by a recovery.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.tellLostReply(ctx)
	return true
}

// lostReplyEvery spaces the resyncs a node asks for after lost replies: a
// Redis too slow to answer in time loses many, and a resync of every node
// per lost reply would only add to its load.
const lostReplyEvery = time.Second

// tellLostReply has every other node resync after this node lost the reply
// of a write that may have landed (noteLostReply): like a crash between a
// script and its publish, nothing else would send what it changed. The
// resyncs send only what differs from what viewers hold. The caller sees
// to this node's own resync.
func (s *Store) tellLostReply(ctx context.Context) {
	s.m.lostRepliesTold.Inc()
	s.log.Info("a write's reply was lost: every node resyncs")
	s.publish(ctx, []pubMsg{{membershipChannel, s.deadPayload()}})
	s.restateStatuses(ctx)
}

// maxStatusesLost bounds the users whose status is to be sent again; past
// it the oldest go unsent (their viewers still get the resync).
const maxStatusesLost = 10000

// restateStatuses sends every node the status of each user whose status
// write lost its reply, for the user's own connections: a resync tells
// viewers what they see, not a user's devices their own status. It is sent
// at the user's version now, which only a device holding an older one
// takes.
func (s *Store) restateStatuses(ctx context.Context) {
	users := dedupe(s.statusesLost.take())
	if len(users) == 0 {
		return
	}
	ps, err := s.Presence(ctx, users)
	if err != nil {
		s.statusesLost.addDroppingOldest(maxStatusesLost, users...)
		s.replyLost.Store(true) // tried again at the next tell
		return
	}
	sts := make([]presence.StatusChange, len(ps))
	for i, p := range ps {
		sts[i] = presence.StatusChange{UserID: p.UserID, Version: p.Version, Status: p.Status}
	}
	s.publishStatuses(ctx, sts)
}
