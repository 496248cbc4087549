package latency

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// udpServer answers every datagram after delay with the datagrams of
// answer(request), or not at all when answer returns none.
func udpServer(t *testing.T, delay time.Duration, answer func([]byte) [][]byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			req := append([]byte(nil), buf[:n]...)
			go func() {
				time.Sleep(delay)
				for _, a := range answer(req) {
					pc.WriteTo(a, from)
				}
			}()
		}
	}()
	return pc.LocalAddr().String()
}

func TestUDPProberTimesTheExpectedAnswer(t *testing.T) {
	// Two wrong answers, then the expected one (longer than the prefix).
	addr := udpServer(t, 30*time.Millisecond, func(req []byte) [][]byte {
		return [][]byte{[]byte("nope"), []byte("pon"), append([]byte("pong:"), req...)}
	})
	p := UDPProber{Request: []byte("ping"), Answer: []byte("pong")}
	rtt, err := p.Probe(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if rtt < 30*time.Millisecond {
		t.Errorf("rtt %v is below the server's 30 ms delay", rtt)
	}
	// No datagram with the expected prefix: fails (by the bound or the deadline).
	bad := UDPProber{Request: []byte("ping"), Answer: []byte("PONG")}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := bad.Probe(ctx, addr); err == nil {
		t.Fatal("answers without the expected prefix completed the probe")
	}
	// An empty Answer takes the first datagram.
	anyAnswer := UDPProber{Request: []byte("ping")}
	if _, err := anyAnswer.Probe(context.Background(), addr); err != nil {
		t.Fatalf("empty Answer: %v", err)
	}
}

// A publisher that drops datagrams fails the probe at the deadline; a
// closed port fails it at once (ICMP port unreachable).
func TestUDPProberSilenceAndRefusal(t *testing.T) {
	silent := udpServer(t, 0, func([]byte) [][]byte { return nil })
	p := UDPProber{Request: []byte("ping"), Answer: []byte("pong")}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := p.Probe(ctx, silent); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("silent publisher: got %v, want no answer", err)
	}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().String()
	pc.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := p.Probe(ctx2, closed); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("closed port: got %v, want connection refused", err)
	}
}

// Split sends udp/ targets to the datagram prober, the rest to the stream
// one; PortProber probes the same host on its own port.
func TestSplitAndPortProber(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	echo := udpServer(t, 0, func(req []byte) [][]byte { return [][]byte{req} })
	var tcpPort int
	for _, c := range port {
		tcpPort = tcpPort*10 + int(c-'0')
	}
	split := Split{Stream: TCPProber{}, Datagram: PortProber{Port: tcpPort}}
	// The UDP target's own port is not the TCP one: only PortProber makes it answer.
	if _, err := split.Probe(context.Background(), UDPPrefix+"127.0.0.1:9"); err != nil {
		t.Fatalf("udp target through PortProber: %v", err)
	}
	if _, err := split.Probe(context.Background(), l.Addr().String()); err != nil {
		t.Fatalf("tcp target: %v", err)
	}
	split.Datagram = UDPProber{Request: []byte("x"), Answer: []byte("x")}
	if _, err := split.Probe(context.Background(), UDPPrefix+echo); err != nil {
		t.Fatalf("udp target through UDPProber: %v", err)
	}
	if _, err := (Split{Stream: TCPProber{}}).Probe(context.Background(), UDPPrefix+echo); err == nil {
		t.Fatal("a UDP target without a datagram prober was measured")
	}
}
