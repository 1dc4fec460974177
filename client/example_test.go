package client_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/greendot/greendot/client"
)

// These examples need a running greendot server, so they are compiled but
// not run by go test.

func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "ws://127.0.0.1:8080/v1/connect", client.Options{
		// A real application fetches a fresh JWT from its backend; the
		// client calls this before every connect and after a 4001.
		TokenFunc: func(ctx context.Context) (string, error) { return fetchToken(ctx) },
		Device:    "desktop",
		OnChange: func(ch client.Change) {
			fmt.Printf("%s is %s\n", ch.UserID, ch.State)
		},
		OnStateChange: func(s client.StateChange) {
			if s.State == client.Disconnected {
				slog.Info("greendot: reconnecting", "in", s.Retry, "err", s.Err)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The snapshot is in: everyone visible who is online or away.
	for _, s := range c.All() {
		fmt.Println(s.UserID, s.State)
	}
}

func ExampleClient_Changes() {
	c, err := client.Dial(context.Background(), "ws://127.0.0.1:8080/v1/connect", client.Options{User: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// A slow reader never holds the client up: while the channel is full,
	// waiting changes are coalesced to the latest per user.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		select {
		case ch, ok := <-c.Changes(): // closed by Close
			if !ok {
				return
			}
			fmt.Printf("%s is %s (version %d, was %q)\n", ch.UserID, ch.State, ch.Version, ch.Previous)
		case <-ctx.Done():
			return
		}
	}
}

func ExampleClient_Query() {
	c, err := client.Dial(context.Background(), "ws://127.0.0.1:8080/v1/connect", client.Options{User: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	users, err := c.Query(ctx, []string{"bob", "carol"})
	if err != nil {
		log.Fatal(err)
	}
	for _, u := range users {
		// "bob online v7 on 1 connection [web]", "bob offline v8 last seen
		// 2025-11-30T10:04:05.123Z", or "carol unknown" for a user who
		// shares no team with alice.
		fmt.Println(u)
	}
}

func ExampleClient_SetStatus() {
	c, err := client.Dial(context.Background(), "ws://127.0.0.1:8080/v1/connect", client.Options{User: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The user went idle: this device is away (re-sent after reconnects).
	if err := c.SetStatus(context.Background(), "away"); err != nil {
		log.Fatal(err)
	}
}

// A load generator: its own heartbeat schedule, round-trip times, and the
// receipt time of every change.
func ExampleClient_Ping() {
	c, err := client.Dial(context.Background(), "ws://127.0.0.1:8080/v1/connect", client.Options{
		User:              "load-0001",
		HeartbeatInterval: 5 * time.Second, // instead of the server's advice; still jittered
		OnChange: func(ch client.Change) {
			if !ch.FromSnapshot {
				fmt.Println("delivery lag", ch.Received.Sub(ch.At))
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	rtt, err := c.Ping(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("heartbeat round trip", rtt)

	// Become a hung client: TCP stays open, nothing is sent. The server
	// declares it dead after its ttl; Freeze(false) brings it back.
	c.Freeze(true)
}

func fetchToken(context.Context) (string, error) { return "a JWT from your backend", nil }
