package ogs_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func adminCorefile(gws []*countingGateway, ttl int, admins ...string) string {
	var b strings.Builder
	for i, block := range []string{"vpn.example.test", "other.example.test"} {
		fmt.Fprintf(&b, "%s {\n\tbind 127.0.0.1\n\treload 2s 0s\n\togs {\n", block)
		for j, g := range gws {
			fmt.Fprintf(&b, "\t\tgateway gw%d.example.test %s\n", j+1, g.Addr)
		}
		fmt.Fprintf(&b, "\t\tprobe http /\n\t\tprobes 2\n\t\trecheck off\n\t\tttl %d\n", ttl)
		if admins[i] != "" {
			fmt.Fprintf(&b, "\t\tadmin %s\n", admins[i])
		}
		b.WriteString("\t}\n}\n")
	}
	return b.String()
}

func adminRaw(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/ogs")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return string(data), err
}

// Two ogs blocks on one admin address share its listener, one server each;
// the view and the listener survive reloads by the reload plugin (the
// locations, their run counts and times are the state's, adopted); a block
// that drops admin leaves the view, and moving the address closes the old
// listener.
func TestAdminAcrossBlocksAndReloads(t *testing.T) {
	e2e.SkipShort(t)
	gws := []*countingGateway{startCountingGateway(t, "127.0.0.11", 200*ms), startCountingGateway(t, "127.0.0.12", 10*ms)}
	admin := e2e.Addr(t)
	d := startReloadable(t, adminCorefile(gws, 30, admin, admin))
	ask(t, d.addr, "vpn.example.test", dns.TypeA, "10.1.0.0/24")
	ask(t, d.addr, "other.example.test", dns.TypeA, "10.2.0.0/24")
	ask(t, d.addr, "other.example.test", dns.TypeA, "10.3.0.0/24")
	check := func(when string, zones ...string) adminJSON {
		t.Helper()
		v := fetchAdmin(t, admin)
		if len(v.Servers) != len(zones) {
			t.Fatalf("%s: %d servers, want %v", when, len(v.Servers), zones)
		}
		for i, s := range v.Servers {
			wantLocs := map[string]int{"other.example.test.": 2, "vpn.example.test.": 1}[s.Zone]
			if s.Zone != zones[i] || s.Store != "memory" || s.RedisHealthy != nil || s.LocationsTotal != wantLocs || len(s.Locations) != wantLocs ||
				s.RunsTotal != wantLocs || s.LastRun == nil || s.Locations[0].Order[0] != "gw2.example.test" || s.Locations[0].RTTsMs["gw2.example.test"] < 10 {
				t.Fatalf("%s: server %d: %+v", when, i, s)
			}
			if s.Zone == "other.example.test." && !s.Locations[0].ProbedAt.After(s.Locations[1].ProbedAt) {
				t.Fatalf("%s: locations not newest first: %+v", when, s.Locations)
			}
		}
		return v
	}
	before := check("at start", "other.example.test.", "vpn.example.test.")
	raw, _ := adminRaw(admin)
	if strings.Contains(raw, "redis_healthy") {
		t.Fatalf("redis_healthy without store redis: %s", raw)
	}
	conns := totalConns(gws...)

	d.reload(t, adminCorefile(gws, 60, admin, admin), false)
	after := check("after a reload", "other.example.test.", "vpn.example.test.")
	if !after.Servers[1].Locations[0].ProbedAt.Equal(before.Servers[1].Locations[0].ProbedAt) || totalConns(gws...) != conns {
		t.Fatalf("a reload re-probed: %v then %v, %d then %d connections", before.Servers[1].Locations[0].ProbedAt, after.Servers[1].Locations[0].ProbedAt, conns, totalConns(gws...))
	}

	d.reload(t, adminCorefile(gws, 60, admin, ""), false)
	check("other block without admin", "vpn.example.test.")

	moved := e2e.Addr(t)
	d.reload(t, adminCorefile(gws, 60, moved, ""), false)
	if v := fetchAdmin(t, moved); len(v.Servers) != 1 || v.Servers[0].RunsTotal != 1 {
		t.Fatalf("at the new address: %+v", v)
	}
	if _, err := adminRaw(admin); err == nil {
		t.Fatal("the old admin address still answers")
	}
	resp, err := http.Post("http://"+moved+"/ogs", "text/plain", nil)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %v %v", resp, err)
	}
	resp.Body.Close()
}

// An admin address already taken stops CoreDNS at start, naming it.
func TestAdminAddressInUseFailsAtStart(t *testing.T) {
	e2e.SkipShort(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cf := fmt.Sprintf("vpn.example.test {\n\tbind 127.0.0.1\n\togs {\n\t\tgateway a 127.0.0.1:1\n\t\tadmin %s\n\t}\n}\n", l.Addr())
	path := filepath.Join(t.TempDir(), "Corefile")
	os.WriteFile(path, []byte(cf), 0o644)
	cmd := exec.Command(e2e.Bin(t, "coredns"), "-conf", path, "-dns.port", strconv.Itoa(e2e.FreePort(t)))
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("coredns started")
	}
	want := fmt.Sprintf("admin %s: listen tcp %s: bind: address already in use", l.Addr(), l.Addr())
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("err %v, output lacks %q:\n%s", err, want, out)
	}
}
