package gatewaysel

import (
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Networks names a client's network, when it has no better identity, as
// AnyConnect's client does: every "DNS suffix|DNS server IP" pair of the
// network's resolver configuration is a key, and a network whose keys match
// any key already seen is that same location (so a location survives a
// change of one DNS server).
type Networks struct {
	mu    sync.Mutex
	byKey map[string]string // key → location
	max   int
}

// NewNetworks returns an alias table holding at most max keys.
func NewNetworks(max int) *Networks {
	return &Networks{byKey: map[string]string{}, max: max}
}

// Location returns the location for a network with these keys: the one an
// existing key points to, else a new one named after the first key.
func (n *Networks) Location(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	loc := keys[0]
	for _, k := range keys {
		if l, ok := n.byKey[k]; ok {
			loc = l
			break
		}
	}
	for _, k := range keys {
		if _, ok := n.byKey[k]; !ok && len(n.byKey) >= n.max {
			for old := range n.byKey { // drop an arbitrary old alias
				delete(n.byKey, old)
				break
			}
		}
		n.byKey[k] = loc
	}
	return loc
}

// ResolvConf reads a resolver configuration file, re-reading it only when
// its modification time changes (checked at most once a second), and gives
// its "suffix|server" keys.
type ResolvConf struct {
	Path string

	mu      sync.Mutex
	checked time.Time
	mtime   time.Time
	keys    []string
	err     error
}

// Keys returns the current keys.
func (r *ResolvConf) Keys(now time.Time) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.checked) < time.Second && (r.keys != nil || r.err != nil) {
		return r.keys, r.err
	}
	r.checked = now
	fi, err := os.Stat(r.Path)
	if err != nil {
		r.keys, r.err = nil, err
		return nil, err
	}
	if fi.ModTime().Equal(r.mtime) && r.keys != nil {
		return r.keys, nil
	}
	cfg, err := dns.ClientConfigFromFile(r.Path)
	if err != nil {
		r.keys, r.err = nil, err
		return nil, err
	}
	r.mtime, r.err = fi.ModTime(), nil
	r.keys = resolvKeys(cfg.Search, cfg.Servers)
	return r.keys, nil
}

func resolvKeys(search, servers []string) []string {
	if len(search) == 0 {
		search = []string{""}
	}
	keys := make([]string, 0, len(search)*len(servers))
	for _, s := range search {
		for _, ip := range servers {
			keys = append(keys, s+"|"+ip)
		}
	}
	return keys
}
