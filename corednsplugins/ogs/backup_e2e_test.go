package ogs_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A backup server that is not a gateway (NAME=ADDRESS:PORT) is never probed
// and comes after its gateway, when that one is first, exactly where its
// backup list names it: gw1 (nearest) with backups gw4, bk, gw3 answers
// gw1 gw4 bk gw3 gw2, although gw3 measures nearer than gw4.
func TestUnprobedBackupAsListed(t *testing.T) {
	addrs, _ := gateways(t, 30*ms, 200*ms, 120*ms, 250*ms)
	cf := fmt.Sprintf(`vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test %s backup gw4.example.test bk.example.test=127.0.0.19:443 gw3.example.test
		gateway gw2.example.test %s
		gateway gw3.example.test %s
		gateway gw4.example.test %s
		probe http /
		srv
		cache_file %s
	}
}
`, addrs[0], addrs[1], addrs[2], addrs[3], filepath.Join(t.TempDir(), "ogs.json"))
	r := startReloadable(t, cf)
	a := dig(t, r.addr, "vpn.example.test", "A", "+short", "+subnet=10.1.0.0/24")
	if want := "127.0.0.11\n127.0.0.14\n127.0.0.19\n127.0.0.13\n127.0.0.12\n"; a != want {
		t.Fatalf("A %q, want %q", a, want)
	}
	srv := dig(t, r.addr, "vpn.example.test", "SRV", "+short", "+subnet=10.1.0.0/24")
	if !strings.Contains(srv, "2 0 443 bk.example.test.") {
		t.Fatalf("SRV lacks the backup at priority 2: %s", srv)
	}
	txt := dig(t, r.addr, "_ogs.vpn.example.test", "TXT", "+short", "+subnet=10.1.0.0/24")
	if !strings.Contains(txt, "bk.example.test 127.0.0.19:443 backup of gw1.example.test, not probed") {
		t.Fatalf("TXT: %s", txt)
	}
	if logs := r.logs(); strings.Contains(logs, "named bk.example.test") || !strings.Contains(logs, "named gw4.example.test") {
		t.Fatalf("the backup server was probed, or the log lacks the gateways':\n%s", logs)
	}
}
