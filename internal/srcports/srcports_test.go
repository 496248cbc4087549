package srcports

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Range{"1024-33279": {1024, 33279}, "8080": {8080, 8080}, " 1-65535 ": {1, 65535}} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0-10", "10-5", "1-65536", "a-b", "1024-", "-5"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

// The default: the whole range 1024–65535 is shared out among the lower-tier
// nodes (L2NS1–L2NS4), each owning an exclusive part.
func TestDefaultSplitFourNodes(t *testing.T) {
	m := Map{Nodes: []Node{{Name: "L2NS1"}, {Name: "L2NS2"}, {Name: "L2NS3"}, {Name: "L2NS4"}}}
	if err := m.Resolve(); err != nil {
		t.Fatal(err)
	}
	want := []Range{{1024, 17151}, {17152, 33279}, {33280, 49407}, {49408, 65535}}
	total := 0
	for i, n := range m.Nodes {
		if *n.Ports != want[i] {
			t.Errorf("%s got %s want %s", n.Name, n.Ports, want[i])
		}
		total += n.Ports.Size()
	}
	if total != 65535-1024+1 {
		t.Errorf("split covers %d ports", total)
	}
	// Every port names exactly its owner (the upper tier's PBR decision).
	for _, p := range []uint16{1024, 17151, 17152, 33280, 40000, 65535} {
		owner, ok := m.Owner(p)
		if !ok || !owner.Ports.Contains(p) {
			t.Errorf("port %d: owner %v %v", p, owner, ok)
		}
	}
	if _, ok := m.Owner(1023); ok {
		t.Error("port 1023 has an owner")
	}
}

func TestSplitUneven(t *testing.T) {
	m := Map{Range: &Range{100, 109}, Nodes: []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}}}
	if err := m.Resolve(); err != nil {
		t.Fatal(err)
	}
	got := []string{m.Nodes[0].Ports.String(), m.Nodes[1].Ports.String(), m.Nodes[2].Ports.String()}
	if strings.Join(got, " ") != "100-103 104-106 107-109" {
		t.Errorf("split %v", got)
	}
}

func TestResolveErrors(t *testing.T) {
	r := func(s string) *Range { v, _ := Parse(s); return &v }
	cases := map[string]Map{
		"overlap":     {Nodes: []Node{{Name: "a", Ports: r("2000-3000")}, {Name: "b", Ports: r("3000-4000")}}},
		"outside":     {Range: r("2000-9000"), Nodes: []Node{{Name: "a", Ports: r("1024-3000")}}},
		"every node":  {Nodes: []Node{{Name: "a", Ports: r("2000-3000")}, {Name: "b"}}},
		"twice":       {Nodes: []Node{{Name: "a"}, {Name: "a"}}},
		"no nodes":    {},
		"has no name": {Nodes: []Node{{}}},
		"fewer ports": {Range: r("10-11"), Nodes: []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}}},
	}
	for want, m := range cases {
		err := m.Resolve()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tiers.json")
	os.WriteFile(p, []byte(`{"nodes":[{"name":"l2a","address":"10.0.0.3:8080","ports":"1024-33279"},{"name":"l2b","ports":"33280-65535"}]}`), 0o644)
	m, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := m.Owner(33280); n.Name != "l2b" {
		t.Errorf("owner of 33280: %v", n)
	}
	os.WriteFile(p, []byte(`{"nodes":[{"name":"l2a","ports":"1024-40000"},{"name":"l2b","ports":"33280-65535"}]}`), 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("overlapping file: %v", err)
	}
	os.WriteFile(p, []byte(`{"nodes":[{"name":"l2a","ports":"40000-30000"}]}`), 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "40000-30000") {
		t.Errorf("bad range: %v", err)
	}
}

func freeRange(t *testing.T, n int) Range {
	t.Helper()
	// Ports below the kernel's ephemeral range are not handed out to other
	// sockets behind our back; pick a block there that is free now.
	for lo := 20000 + os.Getpid()%5000; lo < 32000; lo += n {
		ok := true
		for p := lo; p < lo+n; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return Range{uint16(lo), uint16(lo + n - 1)}
		}
	}
	t.Fatal("no free port block")
	return Range{}
}

func srcPort(c net.Conn) uint16 { return uint16(c.LocalAddr().(*net.TCPAddr).Port) }

func TestDialerStaysInRange(t *testing.T) {
	addr, _ := e2e.HangingListener(t, "127.0.0.1:0")
	r := freeRange(t, 8)
	d := NewDialer(r)
	seen := map[uint16]bool{}
	for range 8 {
		c, err := d.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if p := srcPort(c); !r.Contains(p) {
			t.Fatalf("source port %d outside %s", p, r)
		} else {
			seen[p] = true
		}
	}
	if len(seen) != 8 {
		t.Errorf("8 open connections used %d distinct ports", len(seen))
	}
	// The range is now full toward this destination: the next dial says so.
	_, err := d.DialContext(context.Background(), "tcp", addr)
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("ninth dial: %v", err)
	}
	if d.Exhausted.Load() != 1 {
		t.Errorf("exhausted count %d", d.Exhausted.Load())
	}
	// Another destination may reuse the same ports: only the 4-tuple is unique.
	addr2, _ := e2e.HangingListener(t, "127.0.0.1:0")
	c, err := d.DialContext(context.Background(), "tcp", addr2)
	if err != nil {
		t.Fatalf("dial to a second destination: %v", err)
	}
	c.Close()
}

func TestDialerSkipsPortInUse(t *testing.T) {
	dst, _ := e2e.HangingListener(t, "127.0.0.1:0")
	r := freeRange(t, 3)
	// Something else listens on the middle port.
	busy, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(r.Lo)+1)))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	d := NewDialer(r)
	// Connections are held open: a closed one leaves its 4-tuple in
	// TIME_WAIT, which blocks that port toward this destination for a while.
	for range 2 {
		c, err := d.DialContext(context.Background(), "tcp", dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if p := srcPort(c); p == r.Lo+1 || !r.Contains(p) {
			t.Fatalf("used port %d (busy %d, range %s)", p, r.Lo+1, r)
		}
	}
	if _, err := d.DialContext(context.Background(), "tcp", dst); !errors.Is(err, ErrExhausted) {
		t.Fatalf("third dial with one port busy and two held: %v", err)
	}
	if d.Skipped.Load() == 0 {
		t.Error("no port was skipped")
	}
}

func TestDialerRefusedIsNotExhaustion(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: dials are refused
	d := NewDialer(freeRange(t, 4))
	_, err = d.DialContext(context.Background(), "tcp", addr)
	if err == nil || errors.Is(err, ErrExhausted) || d.Skipped.Load() != 0 {
		t.Errorf("dial to a closed port: %v, skipped %d", err, d.Skipped.Load())
	}
}
