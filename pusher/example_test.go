package pusher_test

import (
	"fmt"

	"github.com/greendot/greendot/pusher"
)

// A presence subscription as pusher-js sends it, checked and read.
func Example() {
	const key, secret = "278d425bdf160c739803", "7ad3773142a6692b25b8"
	socketID := "1234.1234" // the server gives each connection pusher.NewSocketID()

	in, err := pusher.Decode([]byte(`{"event":"pusher:subscribe","data":{"channel":"presence-eng",` +
		`"auth":"278d425bdf160c739803:106107c5828841c847f1bd04b1c8236bb9b15eac0f619a4a2d08b6081d184567",` +
		`"channel_data":"{\"user_id\":10,\"user_info\":{\"name\":\"Ann\"}}"}}`))
	if err != nil {
		panic(err)
	}
	sub, err := pusher.DecodeSubscribe(in.Data)
	if err != nil {
		panic(err)
	}
	team, _ := pusher.PresenceTeam(sub.Channel)
	ok := pusher.CheckChannelAuth(key, secret, socketID, sub.Channel, sub.ChannelData, sub.Auth)
	member, err := pusher.ParseChannelData(sub.ChannelData)
	if err != nil {
		panic(err)
	}
	fmt.Println(in.Event, team, ok, member.UserID, string(member.UserInfo))
	fmt.Println(string(pusher.Frame(pusher.EventSubscriptionSucceeded, sub.Channel,
		pusher.PresenceData([]pusher.Member{{ID: member.UserID, Info: member.UserInfo}}))))
	// Output:
	// pusher:subscribe eng true 10 {"name":"Ann"}
	// {"event":"pusher_internal:subscription_succeeded","channel":"presence-eng","data":"{\"presence\":{\"ids\":[\"10\"],\"hash\":{\"10\":{\"name\":\"Ann\"}},\"count\":1}}"}
}
