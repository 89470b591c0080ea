// A Go program (its runtime makes its own system calls: no LD_PRELOAD shim
// reaches it) that talks to itself over TCP and UDP on the address given, or,
// with "interfaces", lists its interfaces as Go's net package learns them: from
// rtnetlink, through a socket of its own.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if os.Args[1] == "interfaces" {
		interfaces()
		return
	}
	ip := os.Args[1]
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "7811"))
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	go func() {
		s, err := l.Accept()
		if err != nil {
			fmt.Println("accept:", err)
			os.Exit(1)
		}
		b, _ := io.ReadAll(s)
		s.Write(append([]byte("echo "), b...))
		s.Close()
	}()
	c, err := net.DialTimeout("tcp", l.Addr().String(), 10*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	fmt.Println("dialed", c.RemoteAddr())
	c.Write([]byte("hello from go"))
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	fmt.Printf("tcp: %q %v\n", b, err)
	c.Close()

	u, err := net.ListenPacket("udp", net.JoinHostPort(ip, "7812"))
	if err != nil {
		fmt.Println("udp listen:", err)
		os.Exit(1)
	}
	v, err := net.Dial("udp", u.LocalAddr().String())
	if err != nil {
		fmt.Println("udp dial:", err)
		os.Exit(1)
	}
	v.Write([]byte("ping"))
	u.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 100)
	n, from, err := u.ReadFrom(buf)
	fmt.Printf("udp: %q from our dialer: %v %v\n", buf[:n], from.String() == v.LocalAddr().String(), err)
	u.WriteTo([]byte("pong"), from)
	v.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err = v.Read(buf)
	fmt.Printf("udp back: %q %v\n", buf[:n], err)
}

func interfaces() {
	ifs, err := net.Interfaces()
	if err != nil {
		fmt.Println("interfaces:", err)
		os.Exit(1)
	}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			fmt.Println("addrs:", err)
			os.Exit(1)
		}
		for _, a := range addrs {
			fmt.Println(i.Index, i.Name, i.MTU, i.HardwareAddr, a)
		}
	}
}
