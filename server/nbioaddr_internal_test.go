package server

import (
	"net"
	"testing"
	"time"

	"github.com/lesismal/nbio"
)

// The patched nbio keeps an accepted socket's remote address by value and
// shares one local address among the sockets accepted on it
// (third_party/nbio/PATCHES.md): what RemoteAddr and LocalAddr return must
// still be each socket's own (nbhttp puts RemoteAddr in each request).
func TestAcceptedSocketsKeepTheirAddresses(t *testing.T) {
	type addrs struct{ local, remote net.Addr }
	opened := make(chan addrs, 2)
	g := nbio.NewEngine(nbio.Config{Network: "tcp", Addrs: []string{"127.0.0.1:0"}, NPoller: 1})
	g.OnOpen(func(c *nbio.Conn) { opened <- addrs{c.LocalAddr(), c.RemoteAddr()} })
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	var seen []addrs
	for range 2 {
		c, err := net.Dial("tcp", g.Addrs[0])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case a := <-opened:
			if a.remote.String() != c.LocalAddr().String() || a.local.String() != c.RemoteAddr().String() {
				t.Fatalf("accepted with local %v, remote %v; the dialer has %v → %v", a.local, a.remote, c.LocalAddr(), c.RemoteAddr())
			}
			if ta, ok := a.remote.(*net.TCPAddr); !ok || ta.IP.To4() == nil || ta.Port == 0 {
				t.Fatalf("remote address %#v, want a *net.TCPAddr with the IPv4 and port", a.remote)
			}
			seen = append(seen, a)
		case <-time.After(10 * time.Second):
			t.Fatal("no OnOpen within 10 s of the dial")
		}
	}
	if seen[0].local != seen[1].local {
		t.Fatal("two sockets accepted on one address hold two copies of it")
	}
	if seen[0].remote.String() == seen[1].remote.String() {
		t.Fatalf("two sockets with one remote address %v", seen[0].remote)
	}
}
