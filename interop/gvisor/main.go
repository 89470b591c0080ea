// gvisor-peer runs gVisor's netstack (gvisor.dev/gvisor/pkg/tcpip: ARP, IPv4,
// IPv6, TCP) on one network interface through an AF_PACKET socket, and holds one
// TCP conversation with whoever is on the other end of the wire: it listens or
// connects, sends a stream of a deterministic pattern, checks every byte of the
// stream it receives against the pattern, and ends with a FIN or an RST. It is the
// peer of usnet's interop test (crates/usnet-cli/tests/interop_gvisor.rs).
//
// On success it prints one JSON line starting with {"ok":true, keeps its stack
// up until its stdin closes, and exits 0; on any mismatch, error or timeout it
// prints a line starting with "error:" and exits non-zero. It never runs longer
// than -timeout.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const nicID tcpip.NICID = 1

// patternByte is the byte at offset i of the stream numbered seed. The Rust side
// (crates/usnet-cli/tests/interop_gvisor.rs, fn pattern) computes the same.
func patternByte(seed, i uint64) byte {
	x := (i + seed<<40) * 0x9e3779b97f4a7c15
	return byte(x>>56) ^ byte(i>>13)
}

func fill(buf []byte, seed, off uint64) {
	for k := range buf {
		buf[k] = patternByte(seed, off+uint64(k))
	}
}

func fail(format string, args ...any) {
	fmt.Printf("error: "+format+"\n", args...)
	os.Exit(1)
}

// negotiated is what the probe saw of the connection once it was established.
type negotiated struct {
	mu          sync.Mutex
	seen        bool
	sack        bool
	timestamps  bool
	sndWndScale uint8
	rcvWndScale uint8
	// Of the latest segment processed: is everything we sent acknowledged?
	allAcked bool
}

func (n *negotiated) probe(s *tcp.TCPEndpointState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.seen {
		n.seen = true
		n.sack = s.SACKPermitted
		n.timestamps = s.SendTSOk
		n.sndWndScale = s.Sender.SndWndScale
		n.rcvWndScale = s.Receiver.RcvWndScale
	}
	n.allAcked = s.Sender.SndUna == s.Sender.SndNxt && s.SndBufState.SndBufUsed == 0
}

func (n *negotiated) acked() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allAcked
}

// waitEvent blocks until one of mask's events fires on wq or deadline passes;
// it reports whether the deadline passed. The caller registered before its try.
func waitEvent(ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return false
	case <-t.C:
		return true
	}
}

// openPacketSocket returns an AF_PACKET socket bound to ifname that does not see
// the frames it sends itself.
func openPacketSocket(ifindex int) int {
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		fail("socket(AF_PACKET): %v", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		fail("PACKET_IGNORE_OUTGOING: %v", err)
	}
	// Room for bursts at line rate (root may go past rmem_max).
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		fail("bind(AF_PACKET): %v", err)
	}
	return fd
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

type summary struct {
	OK          bool   `json:"ok"`
	Mode        string `json:"mode"`
	Peer        string `json:"peer"`
	Sent        int64  `json:"sent"`
	Received    int64  `json:"received"`
	PeerClose   string `json:"peer_close"`
	Close       string `json:"close"`
	SACK        bool   `json:"sack"`
	Timestamps  bool   `json:"timestamps"`
	SndWndScale uint8  `json:"snd_wscale"`
	RcvWndScale uint8  `json:"rcv_wscale"`
	Retransmits uint64 `json:"retransmits"`
	FastRetx    uint64 `json:"fast_retransmits"`
	SACKRecov   uint64 `json:"sack_recoveries"`
	Timeouts    uint64 `json:"timeouts"`
	ElapsedMs   int64  `json:"elapsed_ms"`
}

func main() {
	iface := flag.String("iface", "", "interface to attach to (AF_PACKET)")
	addrFlag := flag.String("addr", "", "own address with prefix, e.g. 10.1.0.2/24 or fd01::2/64")
	mode := flag.String("mode", "listen", "listen or connect")
	port := flag.Uint("port", 5001, "port to listen on (listen mode)")
	peer := flag.String("peer", "", "address:port to connect to (connect mode)")
	send := flag.Int64("send", 0, "bytes of the pattern to send")
	recv := flag.Int64("recv", 0, "bytes of the pattern to receive and check")
	sendSeed := flag.Uint64("send-seed", 2, "pattern of the stream sent")
	recvSeed := flag.Uint64("recv-seed", 1, "pattern of the stream received")
	closeHow := flag.String("close", "fin", "how to end: fin (shutdown, then wait for the peer's FIN) or rst (SO_LINGER 0 and close)")
	peerClose := flag.String("peer-close", "fin", "what the peer ends with after its bytes: fin (EOF) or rst (connection reset)")
	timeout := flag.Duration("timeout", 60*time.Second, "exit with an error after this long")
	mtu := flag.Uint("mtu", 1500, "L3 MTU")
	backlog := flag.Int("backlog", 16, "listen backlog: netstack's accept queue capacity (1 answers every SYN with a SYN cookie)")
	finEarly := flag.Bool("fin-early", false, "with -close fin: send the FIN as soon as our stream is sent, not after the peer's has arrived")
	flag.Parse()

	deadline := time.Now().Add(*timeout)
	time.AfterFunc(*timeout, func() { fail("timed out after %v", *timeout) })
	start := time.Now()

	if *iface == "" || *addrFlag == "" {
		fail("-iface and -addr are required")
	}
	if *closeHow != "fin" && *closeHow != "rst" {
		fail("-close is fin or rst")
	}
	if *peerClose != "fin" && *peerClose != "rst" {
		fail("-peer-close is fin or rst")
	}
	prefix, err := netip.ParsePrefix(*addrFlag)
	if err != nil {
		fail("-addr: %v", err)
	}
	ifc, err := net.InterfaceByName(*iface)
	if err != nil {
		fail("interface %s: %v", *iface, err)
	}

	neg := &negotiated{}
	s := stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{
			ipv4.NewProtocol,
			ipv6.NewProtocolWithOptions(ipv6.Options{
				DADConfigs: stack.DADConfigurations{DupAddrDetectTransmits: 0},
			}),
			arp.NewProtocol,
		},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocolProbe(neg.probe)},
	})
	sack := tcpip.TCPSACKEnabled(true)
	if e := s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack); e != nil {
		fail("SACK: %v", e)
	}
	cc := tcpip.CongestionControlOption("cubic")
	if e := s.SetTransportProtocolOption(tcp.ProtocolNumber, &cc); e != nil {
		fail("cubic: %v", e)
	}

	fd := openPacketSocket(ifc.Index)
	linkEP, err := fdbased.New(&fdbased.Options{
		FDs:                []int{fd},
		MTU:                uint32(*mtu),
		EthernetHeader:     true,
		Address:            tcpip.LinkAddress(ifc.HardwareAddr),
		PacketDispatchMode: fdbased.RecvMMsg,
		InterfaceIndex:     ifc.Index,
	})
	if err != nil {
		fail("fdbased: %v", err)
	}
	if e := s.CreateNIC(nicID, linkEP); e != nil {
		fail("CreateNIC: %v", e)
	}

	proto := ipv4.ProtocolNumber
	if prefix.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	own := tcpip.AddrFromSlice(prefix.Addr().AsSlice())
	if e := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          proto,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: own, PrefixLen: prefix.Bits()},
	}, stack.AddressProperties{}); e != nil {
		fail("address: %v", e)
	}
	subnet, e2 := tcpip.NewSubnet(
		tcpip.AddrFromSlice(prefix.Masked().Addr().AsSlice()),
		tcpip.MaskFromBytes(net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())),
	)
	if e2 != nil {
		fail("subnet: %v", e2)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})

	var wq waiter.Queue
	ep, e := s.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if e != nil {
		fail("endpoint: %v", e)
	}
	var cwq *waiter.Queue
	var conn tcpip.Endpoint
	var peerAddr tcpip.FullAddress
	switch *mode {
	case "listen":
		if e := ep.Bind(tcpip.FullAddress{Port: uint16(*port)}); e != nil {
			fail("bind: %v", e)
		}
		// netstack's backlog is the accept queue's capacity (the sentry adds one to
		// listen(2)'s), and with a capacity of 1 every SYN is answered with a SYN
		// cookie, whose SYN-ACK carries neither window scaling nor SACK.
		if e := ep.Listen(*backlog); e != nil {
			fail("listen: %v", e)
		}
		fmt.Printf("listening %s port %d\n", prefix.Addr(), *port)
		we, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
		wq.EventRegister(&we)
		for {
			n, q, e := ep.Accept(&peerAddr)
			if e == nil {
				conn, cwq = n, q
				break
			}
			if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
				fail("accept: %v", e)
			}
			if waitEvent(ch, deadline) {
				fail("no connection accepted")
			}
		}
		wq.EventUnregister(&we)
		ep.Close()
	case "connect":
		ap, err := netip.ParseAddrPort(*peer)
		if err != nil {
			fail("-peer: %v", err)
		}
		peerAddr = tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(ap.Addr().AsSlice()), Port: ap.Port()}
		we, ch := waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
		wq.EventRegister(&we)
		e := ep.Connect(peerAddr)
		if _, ok := e.(*tcpip.ErrConnectStarted); ok {
			if waitEvent(ch, deadline) {
				fail("connect to %v: no answer", ap)
			}
			e = ep.LastError()
		}
		wq.EventUnregister(&we)
		if e != nil {
			fail("connect to %v: %v", ap, e)
		}
		conn, cwq = ep, &wq
	default:
		fail("-mode is listen or connect")
	}
	fmt.Printf("connected %v\n", peerAddr.Addr)

	// Both streams at once. Neither side ends before it has received the
	// other's bytes (unless -fin-early): netstack sends no SACK blocks once it
	// has sent its FIN (docs/tcp.md in usnet).
	var wg sync.WaitGroup
	var sent, received int64
	var sendErr, recvErr string
	wg.Add(2)
	go func() {
		defer wg.Done()
		sent, sendErr = writeStream(conn, cwq, *send, *sendSeed, deadline)
		if sendErr == "" && *finEarly && *closeHow == "fin" {
			if e := conn.Shutdown(tcpip.ShutdownWrite); e != nil {
				sendErr = "shutdown: " + e.String()
			}
		}
	}()
	go func() {
		defer wg.Done()
		received, recvErr = readStream(conn, cwq, *recv, *recvSeed, deadline)
	}()
	wg.Wait()
	if sendErr != "" {
		fail("send: %s (%d of %d bytes sent)", sendErr, sent, *send)
	}
	if recvErr != "" {
		fail("receive: %s (%d of %d bytes received)", recvErr, received, *recv)
	}
	if *closeHow == "fin" && !*finEarly {
		if e := conn.Shutdown(tcpip.ShutdownWrite); e != nil {
			fail("shutdown: %v", e)
		}
	}
	peerEnd, endErr := readEnd(conn, cwq, deadline)
	if endErr != "" {
		fail("after the last byte: %s", endErr)
	}
	if peerEnd != *peerClose {
		fail("the peer ended with %s, expected %s", peerEnd, *peerClose)
	}

	if *closeHow == "rst" {
		if peerEnd == "rst" {
			fail("cannot reset a connection the peer reset")
		}
		// Reset only once everything sent is acknowledged: what the peer has not
		// received when the RST goes out is never sent. The probe sees every
		// acknowledgment.
		for !neg.acked() {
			if time.Now().After(deadline) {
				fail("sent data never all acknowledged")
			}
			time.Sleep(5 * time.Millisecond)
		}
		conn.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true, Timeout: 0})
		conn.Close()
	} else if peerEnd == "fin" {
		// Both FINs sent and acknowledged: TIME-WAIT (we closed first or at the
		// same time) or CLOSED (we were last).
		for {
			st := tcp.EndpointState(conn.State())
			if st == tcp.StateTimeWait || st == tcp.StateClose {
				break
			}
			if time.Now().After(deadline) {
				fail("connection did not close cleanly: state %v", st)
			}
			time.Sleep(5 * time.Millisecond)
		}
		conn.Close()
	} else {
		conn.Close()
	}
	neg.mu.Lock()
	st := s.Stats().TCP
	out := summary{
		OK:          true,
		Mode:        *mode,
		Peer:        fmt.Sprintf("%v", peerAddr.Addr),
		Sent:        sent,
		Received:    received,
		PeerClose:   peerEnd,
		Close:       *closeHow,
		SACK:        neg.sack,
		Timestamps:  neg.timestamps,
		SndWndScale: neg.sndWndScale,
		RcvWndScale: neg.rcvWndScale,
		Retransmits: st.Retransmits.Value(),
		FastRetx:    st.FastRetransmit.Value(),
		SACKRecov:   st.SACKRecovery.Value(),
		Timeouts:    st.Timeouts.Value(),
		ElapsedMs:   time.Since(start).Milliseconds(),
	}
	neg.mu.Unlock()
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	// The stack stays up until stdin closes: the peer may still need an answer
	// (a FIN retransmitted because our last ACK was lost gets one from
	// TIME-WAIT). The timeout still applies.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// writeStream writes n bytes of pattern seed. It returns the bytes written and
// an error text.
func writeStream(ep tcpip.Endpoint, wq *waiter.Queue, n int64, seed uint64, deadline time.Time) (int64, string) {
	we, ch := waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	buf := make([]byte, 64<<10)
	var off int64
	for off < n {
		chunk := buf[:min(int64(len(buf)), n-off)]
		fill(chunk, seed, uint64(off))
		for len(chunk) > 0 {
			var r bytesPayload = chunk
			w, e := ep.Write(&r, tcpip.WriteOptions{})
			if w > 0 {
				off += w
				chunk = chunk[w:]
				continue
			}
			if _, ok := e.(*tcpip.ErrWouldBlock); ok {
				if waitEvent(ch, deadline) {
					return off, "timed out"
				}
				continue
			}
			if e != nil {
				return off, e.String()
			}
		}
	}
	return off, ""
}

// readStream reads and checks n bytes of pattern seed.
func readStream(ep tcpip.Endpoint, wq *waiter.Queue, n int64, seed uint64, deadline time.Time) (int64, string) {
	we, ch := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	buf := make([]byte, 64<<10)
	var off int64
	for off < n {
		w := tcpip.SliceWriter(buf[:min(int64(len(buf)), n-off)])
		res, e := ep.Read(&w, tcpip.ReadOptions{})
		if res.Count > 0 {
			for k, b := range buf[:res.Count] {
				if want := patternByte(seed, uint64(off)+uint64(k)); b != want {
					return off, fmt.Sprintf("byte %d is %#02x, expected %#02x", off+int64(k), b, want)
				}
			}
			off += int64(res.Count)
			continue
		}
		switch e.(type) {
		case nil:
		case *tcpip.ErrWouldBlock:
			if waitEvent(ch, deadline) {
				return off, "timed out"
			}
		default:
			return off, e.String()
		}
	}
	return off, ""
}

// readEnd reads past the stream's end to see how the peer ended it: "fin"
// (EOF) or "rst" (reset). A byte there is an error.
func readEnd(ep tcpip.Endpoint, wq *waiter.Queue, deadline time.Time) (string, string) {
	we, ch := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	var one [1]byte
	for {
		w := tcpip.SliceWriter(one[:])
		res, e := ep.Read(&w, tcpip.ReadOptions{})
		if res.Count > 0 {
			return "", "a byte past the expected end"
		}
		switch e.(type) {
		case nil:
		case *tcpip.ErrWouldBlock:
			if waitEvent(ch, deadline) {
				return "", "timed out waiting for the peer's FIN or RST"
			}
		case *tcpip.ErrClosedForReceive:
			return "fin", ""
		case *tcpip.ErrConnectionReset:
			return "rst", ""
		default:
			return "", e.String()
		}
	}
}

// bytesPayload is a tcpip.Payloader over a byte slice.
type bytesPayload []byte

func (b *bytesPayload) Read(p []byte) (int, error) {
	n := copy(p, *b)
	*b = (*b)[n:]
	return n, nil
}

func (b *bytesPayload) Len() int { return len(*b) }
