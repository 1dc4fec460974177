package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// Example runs end to end against a greendot server started in the same
// process: alice watches, bob comes online, then goes away.
func Example() {
	url, stop := exampleServer("team-1", "alice", "bob")
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	changes := make(chan client.Change, 8)
	alice, err := client.Dial(ctx, url, client.Options{User: "alice", Logger: quiet,
		OnChange: func(ch client.Change) { changes <- ch }})
	if err != nil {
		log.Fatal(err)
	}
	defer alice.Close()

	bob, err := client.Dial(ctx, url, client.Options{User: "bob", Device: "ios", Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer bob.Close()
	ch := <-changes
	fmt.Println(ch.UserID, ch.State)
	if err := bob.SetStatus(ctx, "away"); err != nil {
		log.Fatal(err)
	}
	ch = <-changes
	fmt.Println(ch.UserID, ch.State)

	users, err := alice.Query(ctx, []string{"bob"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(users[0].UserID, users[0].State, users[0].Devices)
	// Output:
	// bob online
	// bob away
	// bob away [ios]
}

// exampleServer starts a server on a free port with one team.
func exampleServer(team string, members ...string) (url string, stop func()) {
	st, err := memstore.New(memstore.Config{Grace: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", Store: st,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	for _, m := range members {
		if err := st.AddMember(context.Background(), team, m); err != nil {
			log.Fatal(err)
		}
	}
	return "ws://" + srv.Addr() + "/v1/connect", func() { _ = srv.Shutdown(context.Background()) }
}
