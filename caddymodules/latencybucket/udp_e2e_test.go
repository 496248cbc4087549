package latencybucket_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// dnsPublisher starts a DNS server on UDP at addr (host:0 for a free
// port) that answers every query after delay with a TXT record naming it,
// or, if silent, reads every query and answers none (a resolver behind a
// firewall that drops). It returns the address it listens on.
func dnsPublisher(t *testing.T, addr, name string, delay time.Duration, silent bool) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		if silent {
			return
		}
		time.Sleep(delay)
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 {
			m.Answer = append(m.Answer, &dns.TXT{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET},
				Txt: []string{name},
			})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// udpFlow is one flow through the UDP front: a fresh socket from source IP
// src (a new port, so a new flow for caddy-l4) sends one query and returns
// the name of the publisher that answered.
func udpFlow(front, src string, wait time.Duration) (string, error) {
	return udpFlowVia(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}).DialContext(ctx, network, addr)
	}, front, wait)
}

// udpFlowVia is udpFlow through dial, whose sockets carry their source.
func udpFlowVia(dial func(ctx context.Context, network, addr string) (net.Conn, error), front string, wait time.Duration) (string, error) {
	c, err := dial(context.Background(), "udp", front)
	if err != nil {
		return "", err
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	conn.SetDeadline(time.Now().Add(wait))
	q := new(dns.Msg)
	q.SetQuestion("app.example.", dns.TypeTXT)
	if err := conn.WriteMsg(q); err != nil {
		return "", err
	}
	r, err := conn.ReadMsg()
	if err != nil {
		return "", err
	}
	if len(r.Answer) != 1 {
		return "", fmt.Errorf("answer %v", r)
	}
	return r.Answer[0].(*dns.TXT).Txt[0], nil
}

// decisionLine is a log_decisions line as bin/caddy writes it.
type decisionLine struct {
	Msg       string  `json:"msg"`
	Logger    string  `json:"logger"`
	Policy    string  `json:"policy"`
	User      string  `json:"user"`
	App       string  `json:"app"`
	Publisher string  `json:"publisher"`
	Bucket    string  `json:"bucket"`
	Decision  string  `json:"decision"`
	DecidedBy string  `json:"decided_by"`
	Network   string  `json:"network"`
	Latency   float64 `json:"latency_ms"`
}

// decisions returns the log_decisions lines in logs.
func decisions(t *testing.T, logs string) []decisionLine {
	var out []decisionLine
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l decisionLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "publisher decision" {
			out = append(out, l)
		}
	}
	return out
}

// waitDecisions waits up to 10 s for n decision lines in c's output (it
// reaches the test through a pipe, a moment after bin/caddy wrote it) and
// returns them all.
func waitDecisions(t *testing.T, c *e2e.Caddy, n int) []decisionLine {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * ms) {
		if lines := decisions(t, c.Logs()); len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
	}
}

// UDP publishers through bin/caddy (caddy-l4's UDP listener, the example
// publisher-selection-udp.Caddyfile): four DNS resolvers probed by a DNS
// query; two answer at once, one 100 ms late, one drops every query. Once
// measured (the silent one inactive: its probes time out), 16 client IPs
// at once open 4 flows each, one after another: every flow reaches one of the two near resolvers,
// each client IP keeps its resolver across its flows, and both near ones
// serve someone. Every pick is one log_decisions line (new, then sticky).
// A reload without log_decisions keeps every pin and logs no pick.
func TestUDPPublishersNearestAndPinned(t *testing.T) {
	e2e.SkipShort(t)
	pubs := []string{
		dnsPublisher(t, "127.0.0.1:0", "near-1", 0, false),
		dnsPublisher(t, "127.0.0.1:0", "near-2", 0, false),
		dnsPublisher(t, "127.0.0.1:0", "far", 100*ms, false),
		dnsPublisher(t, "127.0.0.1:0", "silent", 0, true),
	}
	front := e2e.Addr(t)
	cfg := example(t, "publisher-selection-udp.Caddyfile", "127.0.0.1:5353", front,
		"127.0.0.1:9101", pubs[0], "127.0.0.1:9102", pubs[1], "127.0.0.1:9103", pubs[2], "127.0.0.1:9104", pubs[3],
		"probe_interval 2s", "probe_interval 300ms", "probe_timeout 1s", "probe_timeout 400ms")
	c := e2e.StartCaddy(t, "caddyfile", cfg)
	v := waitView(t, c, "dns-resolvers", "3 measured, the silent one inactive", func(v latencybucket.PolicyView) bool {
		measured, silentOut := 0, false
		for _, p := range v.Publishers {
			if p.Measured && p.Active && p.Rounds >= 2 {
				measured++
			}
			if p.Address == "udp/"+pubs[3] && !p.Active && p.Rounds >= 2 {
				silentOut = true
			}
		}
		return measured == 3 && silentOut
	})
	for _, p := range v.Publishers {
		t.Logf("%s: %s %.1f ms active=%v %s", p.Address, p.Bucket, p.LatencyMS, p.Active, p.LastError)
	}
	before := len(decisions(t, c.Logs()))

	// The users at once, each one's flows one after another.
	const users, flows = 16, 4
	got := make([][]string, users)
	errs := make(chan error, users)
	e2e.Together(users, func(u int) {
		for range flows {
			name, err := udpFlow(front, fmt.Sprintf("127.0.0.%d", 10+u), 5*time.Second)
			if err != nil {
				errs <- fmt.Errorf("user %d: %v", u, err)
				return
			}
			got[u] = append(got[u], name)
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pinned := map[string]string{}
	served := map[string]int{}
	for u, names := range got {
		src := fmt.Sprintf("127.0.0.%d", 10+u)
		pinned[src] = names[0]
		for f, name := range names {
			served[name]++
			if name != names[0] {
				t.Fatalf("user %s: flow %d went to %s, its first to %s", src, f, name, names[0])
			}
		}
	}
	t.Logf("flows per publisher: %v", served)
	if served["far"]+served["silent"] != 0 || served["near-1"] == 0 || served["near-2"] == 0 {
		t.Fatalf("flows per publisher %v: want only near-1 and near-2, both", served)
	}

	// One decision line per flow: the user, the listener as app, a near
	// publisher of [0,32) by probe; new for a user's first flow, then sticky.
	lines := waitDecisions(t, c, before+users*flows)[before:]
	if len(lines) != users*flows {
		t.Fatalf("%d decision lines for %d flows", len(lines), users*flows)
	}
	newOf := map[string]int{}
	for _, l := range lines {
		want := "udp/" + pubs[0]
		if pinned[l.User] == "near-2" {
			want = "udp/" + pubs[1]
		}
		if l.Publisher != want || l.App != front || l.Bucket != "[0,32)" || l.DecidedBy != "probe" ||
			l.Network != "udp" || l.Policy != "dns-resolvers" || l.Latency <= 0 {
			t.Fatalf("decision line %+v: want user %s on %s, app %s, bucket [0,32) by probe", l, l.User, want, front)
		}
		if l.Decision == "new" {
			newOf[l.User]++
		} else if l.Decision != "sticky" {
			t.Fatalf("decision %q", l.Decision)
		}
	}
	for src := range pinned {
		if newOf[src] != 1 {
			t.Fatalf("user %s: %d new decisions, want 1 (then sticky)", src, newOf[src])
		}
	}

	// Off by default: reloaded without log_decisions, the pins hold and no
	// pick is logged.
	c.Reload(t, "caddyfile", strings.Replace(cfg, "\t\tlog_decisions\n", "\n", 1))
	time.Sleep(500 * ms) // the old generation's flows are done; the new listener is up
	before = len(decisions(t, c.Logs()))
	for src, want := range pinned {
		name, err := udpFlow(front, src, 5*time.Second)
		if err != nil || name != want {
			t.Fatalf("after reload, user %s went to %s (%v), before to %s", src, name, err, want)
		}
	}
	time.Sleep(500 * ms) // bin/caddy's output reaches the test through a pipe
	if n := len(decisions(t, c.Logs())) - before; n != 0 {
		t.Fatalf("%d decision lines without log_decisions", n)
	}
}

// bin/caddy refuses at load what the UDP and log rules forbid, naming the
// option (or upstream) and the value.
func TestUDPConfigErrorsAtLoad(t *testing.T) {
	e2e.SkipShort(t)
	l4 := func(policy string) string {
		return "{\n\tlayer4 {\n\t\tudp/127.0.0.1:5353 {\n\t\t\troute {\n\t\t\t\tproxy udp/127.0.0.1:9101 127.0.0.1:9102 {\n" +
			"\t\t\t\t\tlb_policy latency_bucket {\n" + policy + "\n\t\t\t\t\t}\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n"
	}
	for _, tc := range []struct{ cfg, want string }{
		{l4("probe_interval 1s"), "latency_bucket: upstream udp/127.0.0.1:9101: a UDP upstream needs udp_probe"},
		{l4("udp_probe tcp 0"), `latency_bucket: udp_probe "0": want a whole number from 1 to 65535`},
		{l4("udp_probe udp_hex 0g"), `latency_bucket: udp_probe request_hex "0g": not hexadecimal`},
		{"http://127.0.0.1:8080 {\n\treverse_proxy 127.0.0.1:9101 {\n\t\tlb_policy latency_bucket {\n\t\t\tlog_decisions\n\t\t}\n\t}\n}\n",
			"latency_bucket: log_decisions true: layer4 only"},
	} {
		e2e.ValidateFails(t, tc.cfg, tc.want)
	}
}
