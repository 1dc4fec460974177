package store

import (
	"context"
	"time"
)

// TEMPORARY until the store branch lands.
type Broadcaster interface {
	Broadcast(ctx context.Context, payload []byte) error
	OnBroadcast(h func(payload []byte))
}

type ChannelCounter interface {
	SetChannelCounts(ctx context.Context, counts map[string]int) error
	ChannelCounts(ctx context.Context, prefix string) (map[string]int, error)
}

const ChannelCountsRefresh = 5 * time.Second
const ChannelCountsTTL = 15 * time.Second

type MemberInfos interface {
	SetMemberInfo(ctx context.Context, team, user string, info []byte) error
	MemberInfos(ctx context.Context, team string, users []string) ([][]byte, error)
}
