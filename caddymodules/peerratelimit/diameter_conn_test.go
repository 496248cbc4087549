package peerratelimit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// repeatStream is a client's stream: a CER, then msg again and again.
type repeatStream struct {
	head, msg []byte
	off       int
}

func (r *repeatStream) Read(p []byte) (int, error) {
	n := 0
	if len(r.head) > 0 {
		n = copy(p, r.head)
		r.head = r.head[n:]
	}
	for n < len(p) {
		k := copy(p[n:], r.msg[r.off:])
		n += k
		r.off = (r.off + k) % len(r.msg)
	}
	return n, nil
}

// The Diameter mode's whole per-message path on the client side —
// framing, classifying, the placeholders, the profile, the type's and the
// overall buckets, the counters, and the copy to the proxy — allocates
// nothing once the connection's peer is known; and one Read hands the
// proxy many whole messages.
func TestDiameterReadAllocatesNothing(t *testing.T) {
	cer, _ := diameter.Request(diameter.CmdCapabilitiesExchange, 0, 0, 1, 1, "", "pgw1.example", "example")
	ccr, _ := diameter.Request(diameter.CmdCreditControl, diameter.AppGx, 2, 2, 2, "pgw1;2", "pgw1.example", "example")
	dc, cx := testDiameterConn(t, &repeatStream{head: cer, msg: ccr})
	p := make([]byte, 32*1024)
	n, err := dc.Read(p)
	if err != nil || n < len(p)/2 {
		t.Fatalf("first read: %d bytes, %v; want many messages", n, err)
	}
	if dc.identity != "pgw1.example" {
		t.Fatalf("identity %q after the CER", dc.identity)
	}
	msgs := 0
	// One run of 200 Reads: AllocsPerRun's average over a single run is
	// the exact count (over 200 runs it would round 199 allocations down
	// to 0). Background goroutines of the process count too.
	allocs := testing.AllocsPerRun(1, func() {
		for range 200 {
			n, err := dc.Read(p)
			if err != nil || n < len(p)/2 { // up to the last whole message buffered
				t.Fatalf("read: %d bytes, %v", n, err)
			}
			msgs += n / len(ccr)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations in 200 Reads of about %d messages each, want 0", allocs, len(p)/len(ccr))
	}
	if v, _ := cx.Replacer().Get("l4.peer_rate_limit.verdict"); v != "admitted" {
		t.Errorf("verdict %v, want admitted", v)
	}
	if msgs < 400*(len(p)/len(ccr)-1) { // AllocsPerRun's warm-up run and the counted one
		t.Errorf("%d messages in 400 reads", msgs)
	}
}

// testDiameterConn is the Diameter mode's connection over src, with a
// profile whose limits are never reached.
func testDiameterConn(t *testing.T, src io.Reader) (*diameterConn, *layer4.Connection) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	h := &L4Handler{
		leasedConfig: leasedConfig{Profiles: []ProfileConfig{{Name: "all", Rate: 1e9,
			Messages: []MessageConfig{{Type: "gx-ccr-u", Rate: 1e9}}}}},
		Diameter: &DiameterMode{OriginHost: "dra.example", OriginRealm: "example"},
	}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	cx := layer4.WrapConnection(server, nil, zap.NewNop())
	dc := &diameterConn{Conn: cx, h: h, cx: cx, addr: func() string { return remoteAddr(cx).String() },
		in:  diameter.NewFramer(src, 0, h.Diameter.MaxLength),
		out: &diameter.BoundaryWriter{W: io.Discard}}
	return dc, cx
}

// A malformed message after admitted ones that one Read would hand out
// together: those go first, whole, and the next Read fails (the
// connection is closed); nothing after the malformed message is read.
func TestDiameterMalformedAfterAdmittedMessages(t *testing.T) {
	cer, _ := diameter.Request(diameter.CmdCapabilitiesExchange, 0, 0, 1, 1, "", "pgw1.example", "example")
	ccr, _ := diameter.Request(diameter.CmdCreditControl, diameter.AppGx, 2, 2, 2, "pgw1;2", "pgw1.example", "example")
	bad := append([]byte(nil), ccr...)
	bad[20+7] = 0xff // the first AVP's length past the message
	stream := bytes.Join([][]byte{cer, ccr, ccr, bad, ccr}, nil)
	dc, _ := testDiameterConn(t, bytes.NewReader(stream))
	p := make([]byte, 32*1024)
	n, err := dc.Read(p)
	if err != nil || !bytes.Equal(p[:n], stream[:len(cer)+2*len(ccr)]) {
		t.Fatalf("first read: %d bytes, %v; want the CER and two CCRs", n, err)
	}
	if n, err := dc.Read(p); n != 0 || !errors.Is(err, diameter.ErrMalformed) {
		t.Fatalf("second read: %d bytes, %v; want the malformed message's error", n, err)
	}
	if n, err := dc.Read(p); n != 0 || err == nil {
		t.Fatalf("third read: %d bytes, %v; want the error again", n, err)
	}
}
