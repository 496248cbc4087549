package gatewaysel

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Location A has suffix locationa.com and DNS servers
// ip1 and ip2; each pair is a key to the same cache entry, and a network
// matching any of them is location A.
func TestNetworksLocationA(t *testing.T) {
	n := NewNetworks(100)
	a := n.Location([]string{"locationa.com|ip1", "locationa.com|ip2"})
	if got := n.Location([]string{"locationa.com|ip2", "locationa.com|ip3"}); got != a {
		t.Fatalf("a network sharing one key is %q, want location A %q", got, a)
	}
	if got := n.Location([]string{"locationa.com|ip3"}); got != a {
		t.Fatalf("the new key was not remembered: %q", got)
	}
	if got := n.Location([]string{"hotel.example|ip9"}); got == a {
		t.Fatal("an unrelated network is location A")
	}
	small := NewNetworks(2)
	for i := range 10 {
		small.Location([]string{string(rune('a' + i))})
	}
	if len(small.byKey) > 2 {
		t.Fatalf("%d keys held, bound 2", len(small.byKey))
	}
}

func TestResolvConfKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(path, []byte("search locationa.com\nnameserver 192.0.2.1\nnameserver 192.0.2.2\n"), 0o644)
	r := &ResolvConf{Path: path}
	keys, err := r.Keys(time.Now())
	if err != nil || !slices.Equal(keys, []string{"locationa.com|192.0.2.1", "locationa.com|192.0.2.2"}) {
		t.Fatalf("%v %v", keys, err)
	}
	os.WriteFile(path, []byte("nameserver 198.51.100.7\n"), 0o644)
	os.Chtimes(path, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	keys, _ = r.Keys(time.Now().Add(2 * time.Second))
	if !slices.Equal(keys, []string{"|198.51.100.7"}) {
		t.Fatalf("after a change: %v", keys)
	}
}
