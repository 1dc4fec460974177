// Copyright 2020 lesismal. All rights reserved.
// Use of this source code is governed by an MIT-style
// license that can be found in the LICENSE file.

//go:build linux || darwin || netbsd || freebsd || openbsd || dragonfly
// +build linux darwin netbsd freebsd openbsd dragonfly

package nbio

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

//go:norace
func init() {
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err == nil {
		if n := int(limit.Max); n > 0 && n < MaxOpenFiles {
			MaxOpenFiles = n
		}
	}
}

// localAddrs: one *net.TCPAddr per local address of accepted sockets,
// shared by them (greendot). A host's listeners have few: its addresses
// times the ports listened on. Past maxLocalAddrs (a host accepting on a
// whole routed prefix) a socket keeps its own copy.
var (
	localAddrs  sync.Map // netip.AddrPort → *net.TCPAddr
	localShared atomic.Int32
)

const maxLocalAddrs = 1024

// NBConnAccepted is NBConn for a socket a listener accepted (greendot): its
// local address is shared with the others accepted on that address.
// Callers must not modify it.
//
//go:norace
func NBConnAccepted(conn net.Conn) (*Conn, error) {
	c, err := NBConn(conn)
	if err != nil || c.typ != ConnTypeTCP {
		return c, err
	}
	if ta, ok := c.lAddr.(*net.TCPAddr); ok {
		c.lAddr = sharedLocalAddr(ta)
	}
	return c, nil
}

// sharedLocalAddr is a's shared copy; callers must not modify it.
func sharedLocalAddr(a *net.TCPAddr) net.Addr {
	ap := a.AddrPort()
	if !ap.IsValid() {
		return a
	}
	if v, ok := localAddrs.Load(ap); ok {
		return v.(*net.TCPAddr)
	}
	if localShared.Add(1) > maxLocalAddrs {
		localShared.Add(-1)
		return a
	}
	v, loaded := localAddrs.LoadOrStore(ap, net.TCPAddrFromAddrPort(ap))
	if loaded {
		localShared.Add(-1)
	}
	return v.(*net.TCPAddr)
}

//go:norace
func dupStdConn(conn net.Conn) (*Conn, error) {
	sc, ok := conn.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return nil, errors.New("RawConn Unsupported")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, errors.New("RawConn Unsupported")
	}

	var newFd int
	errCtrl := rc.Control(func(fd uintptr) {
		newFd, err = syscall.Dup(int(fd))
	})

	if errCtrl != nil {
		return nil, errCtrl
	}

	if err != nil {
		return nil, err
	}

	lAddr := conn.LocalAddr()
	rAddr := conn.RemoteAddr()

	_ = conn.Close()

	// err = syscall.SetNonblock(newFd, true)
	// if err != nil {
	// 	syscall.Close(newFd)
	// 	return nil, err
	// }

	c := &Conn{
		fd:    newFd,
		lAddr: lAddr,
		rAddr: rAddr,
	}

	switch conn.(type) {
	case *net.TCPConn:
		c.typ = ConnTypeTCP
		// greendot: the remote address by value (the local one is shared
		// by NBConnAccepted): each *net.TCPAddr from accept holds the
		// sockaddr its IP points into.
		if ta, ok := rAddr.(*net.TCPAddr); ok {
			if ap := ta.AddrPort(); ap.IsValid() {
				c.rAddr, c.rIP, c.rPort = nil, ap.Addr(), ap.Port()
			}
		}
	case *net.UnixConn:
		c.typ = ConnTypeUnix
	case *net.UDPConn:
		lAddrUDP := lAddr.(*net.UDPAddr)
		newLAddr := net.UDPAddr{
			IP:   make([]byte, len(lAddrUDP.IP)),
			Port: lAddrUDP.Port,
			Zone: lAddrUDP.Zone,
		}

		copy(newLAddr.IP, lAddrUDP.IP)

		c.lAddr = &newLAddr

		// no remote addr, this is a listener
		if rAddr == nil {
			c.typ = ConnTypeUDPServer
			c.connUDP = &udpConn{
				parent: c,
				conns:  map[udpAddrKey]*Conn{},
			}
		} else {
			// has remote addr, this is a dialer
			c.typ = ConnTypeUDPClientFromDial
			c.connUDP = &udpConn{
				parent: c,
			}
		}
	default:
	}

	return c, nil
}

//go:norace
func parseDomainAndType(network, addr string) (int, int, syscall.Sockaddr, net.Addr, ConnType, error) {
	var (
		isIPv4 = len(strings.Split(addr, ":")) == 2
	)

	socketResult := func(sockType int, connType ConnType) (int, int, syscall.Sockaddr, net.Addr, ConnType, error) {
		var (
			ip      net.IP
			port    int
			zone    string
			retAddr net.Addr
		)
		if connType == ConnTypeTCP {
			dstAddr, err := net.ResolveTCPAddr(network, addr)
			if err != nil {
				return 0, 0, nil, nil, 0, err
			}
			ip, port, zone, retAddr = dstAddr.IP, dstAddr.Port, dstAddr.Zone, dstAddr
		} else {
			dstAddr, err := net.ResolveUDPAddr(network, addr)
			if err != nil {
				return 0, 0, nil, nil, 0, err
			}
			ip, port, zone, retAddr = dstAddr.IP, dstAddr.Port, dstAddr.Zone, dstAddr
		}

		if isIPv4 {
			return syscall.AF_INET, sockType, &syscall.SockaddrInet4{
				Addr: [4]byte{ip[0], ip[1], ip[2], ip[3]},
				Port: port,
			}, retAddr, connType, nil
		}

		iface, err := net.InterfaceByName(zone)
		if err != nil {
			return 0, 0, nil, nil, 0, err
		}
		addr6 := &syscall.SockaddrInet6{
			Port:   port,
			ZoneId: uint32(iface.Index),
		}
		copy(addr6.Addr[:], ip)
		return syscall.AF_INET6, sockType, addr6, retAddr, connType, nil
	}

	switch network {
	case NETWORK_TCP, NETWORK_TCP4, NETWORK_TCP6:
		return socketResult(syscall.SOCK_STREAM, ConnTypeTCP)
	case NETWORK_UDP, NETWORK_UDP4, NETWORK_UDP6:
		return socketResult(syscall.SOCK_DGRAM, ConnTypeUDPClientFromDial)
	case NETWORK_UNIX, NETWORK_UNIXGRAM, NETWORK_UNIXPACKET:
		sotype := syscall.SOCK_STREAM
		switch network {
		case NETWORK_UNIX:
			sotype = syscall.SOCK_STREAM
		case NETWORK_UNIXGRAM:
			sotype = syscall.SOCK_DGRAM
		case NETWORK_UNIXPACKET:
			sotype = syscall.SOCK_SEQPACKET
		default:
		}
		dstAddr := &net.UnixAddr{
			Net:  network,
			Name: addr,
		}
		return syscall.AF_UNIX, sotype, &syscall.SockaddrUnix{Name: addr}, dstAddr, ConnTypeUnix, nil
	default:
	}
	return 0, 0, nil, nil, 0, net.UnknownNetworkError(network)
}
