package ogs

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/miekg/dns"
)

const testToken = "0123456789abcdef0123"

func tokensFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("alice "+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParseReportErrors(t *testing.T) {
	tokens := tokensFile(t)
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("alice short\n"), 0o600)
	for extra, want := range map[string]string{
		"report_tokens " + tokens: "report_tokens " + tokens + ": needs reports HOST:PORT or admin HOST:PORT",
		"max_reporters 2":         "max_reporters (at ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nmax_reporters 2":             "min_reporters 3 (the default): above max_reporters 2",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreports 127.0.0.1:1":         "reports 127.0.0.1:1: the admin address",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreports 127.0.0.1:99999":     "reports 127.0.0.1:99999: bad port",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_source_prefix 0 64":   "report_source_prefix 0 64: V4LEN: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_source_prefix 32 129": "report_source_prefix 32 129: V6LEN: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nmax_reporters_per_token 0":   "max_reporters_per_token 0: ",
		"admin 127.0.0.1:1\nreport_tokens " + filepath.Dir(tokens):                     "report_tokens " + filepath.Dir(tokens) + ": ",
		"admin 127.0.0.1:1\nreport_tokens " + bad:                                      "shorter than 16 characters",
		"admin 127.0.0.1:1\nreport_tokens " + bad + ".missing":                         "report_tokens " + bad + ".missing: stat " + bad + ".missing: no such file or directory",
		"min_reporters 3": "min_reporters (at ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nmin_reporters 0":                  "min_reporters 0: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_window 1x":                 "report_window 1x: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_window 60d":                "report_window 60d: at most 30 days",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_rate -1":                   "report_rate -1: PER_SECOND \"-1\"",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_rate 1 0":                  "report_rate 1 0: BURST: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nreport_max_body 10":               "report_max_body 10: ",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\ntrusted_proxies 10.0.0.1":         "trusted_proxies 10.0.0.1: \"10.0.0.1\" is not a CIDR prefix",
		"admin 127.0.0.1:1\nreport_tokens " + tokens + "\nmin_reporters 9\nmax_reporters 4": "min_reporters 9: above max_reporters 4",
	} {
		c := caddy.NewTestController("dns", "ogs vpn.example.test {\ngateway gw1 192.0.2.1:1\n"+extra+"\n}")
		_, err := parse(c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", extra, err, want)
		}
	}
	c := caddy.NewTestController("dns", "ogs vpn.example.test {\ngateway gw1 192.0.2.1:1\nadmin 127.0.0.1:1\nreport_tokens "+tokens+
		"\nreport_window 2h\nmin_reporters 2\nmax_reporters 10\nmax_report_locations 50\nreport_rate 5 20\nreport_max_body 4096\ntrusted_proxies 10.0.0.0/8 ::1/128\n}")
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	r := o.cfg.Reports
	if !r.Enabled || r.Window != 2*time.Hour || r.MinReporters != 2 || r.MaxReporters != 10 || r.MaxLocations != 50 || r.Probe != "https" ||
		o.reports.rate != 5 || o.reports.burst != 20 || o.reports.maxBody != 4096 || len(o.reports.trusted) != 2 {
		t.Fatalf("%+v %+v", r, o.reports)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func post(t *testing.T, o *OGS, remote, token, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/ogs/reports", strings.NewReader(body))
	req.RemoteAddr = remote
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	o.serveReport(w, req)
	return w
}

func reportBody(at time.Time, kv ...any) string {
	var gws []string
	for i := 0; i < len(kv); i += 2 {
		gws = append(gws, fmt.Sprintf(`{"name":%q,"rtt_ms":%v}`, kv[i], kv[i+1]))
	}
	return fmt.Sprintf(`{"probe":"tcp","time":%q,"gateways":[%s]}`, at.UTC().Format(time.RFC3339Nano), strings.Join(gws, ","))
}

// In process: three reporters of 10.1.0.0/24 make gw2 first there (ECS
// 10.1.0.0/24 and a source address in it alike), 10.2.0.0/24 keeps the
// probed (here: configured) order; errors have their status and reason.
func TestReportEndpoint(t *testing.T) {
	tokens := tokensFile(t)
	o := newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokens+"\ntrusted_proxies 192.0.2.100/32\nreport_rate 100 100\nreport_max_body 512")
	now := time.Now()
	for i, src := range []string{"10.1.0.1:5000", "10.1.0.2:5000", "192.0.2.100:5000"} {
		var hdr []string
		if i == 2 { // through the trusted proxy, for 10.1.0.3; the body cannot name another network
			hdr = []string{"X-Forwarded-For", "10.1.0.3"}
		}
		w := post(t, o, src, testToken, reportBody(now, "gw1", 90, "gw2", 10, "gw6", 50), hdr...)
		if w.Code != http.StatusAccepted || !strings.Contains(w.Body.String(), `"location":"10.1.0.0/24"`) {
			t.Fatalf("report %d: %d %s", i, w.Code, w.Body)
		}
		if i == 2 && !strings.Contains(w.Body.String(), `"source":"reports"`) {
			t.Fatalf("third reporter: %s", w.Body)
		}
	}
	// An untrusted peer's X-Forwarded-For is ignored: it speaks for its own network.
	if w := post(t, o, "10.2.0.5:1", testToken, reportBody(now, "gw1", 5), "X-Forwarded-For", "10.1.0.77"); !strings.Contains(w.Body.String(), `"location":"10.2.0.0/24"`) {
		t.Fatalf("untrusted X-Forwarded-For: %d %s", w.Code, w.Body)
	}
	r := query(t, o, "vpn.example.test.", dns.TypeSRV, "10.1.0.0/24")
	if len(r.Answer) != 3 || r.Answer[0].(*dns.SRV).Target != "gw2." {
		t.Fatalf("reported location answer %v", r.Answer)
	}
	txt := query(t, o, "_ogs.vpn.example.test.", dns.TypeTXT, "10.1.0.0/24")
	if !strings.Contains(fmt.Sprint(txt.Answer), "source reports") {
		t.Fatalf("TXT %v", txt.Answer)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeSRV, "10.2.0.0/24"); r.Answer[0].(*dns.SRV).Target != "gw1." {
		t.Fatalf("other location answer %v", r.Answer)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeSRV, "10.1.0.0/16"); r.Answer[0].(*dns.SRV).Target != "gw1." {
		t.Fatalf("a /16 ECS subnet used the /24's reports: %v", r.Answer)
	}
	for _, c := range []struct {
		remote, token, body string
		status              int
		reason              string
	}{
		{"10.1.0.9:1", "wrongwrongwrongwrong", reportBody(now, "gw1", 1), 401, "unauthorized"},
		{"10.1.0.9:1", "", reportBody(now, "gw1", 1), 401, "unauthorized"},
		{"10.1.0.9:1", testToken, `{"probe":"tcp","time":"` + now.Format(time.RFC3339) + `","gateways":[` + strings.Repeat(`{"name":"gw1","rtt_ms":1},`, 40) + `{"name":"gw1","rtt_ms":1}]}`, 413, "too_large"},
		{"10.1.0.9:1", testToken, reportBody(now, "gw9", 1), 400, "unknown_gateway"},
		{"10.1.0.9:1", testToken, reportBody(now, "gw1", 3600001), 400, "rtt_out_of_range"},
		{"10.1.0.9:1", testToken, reportBody(now.Add(time.Hour), "gw1", 1), 400, "future"},
		{"10.1.0.9:1", testToken, `{"probe":"tcp"`, 400, "malformed"},
		{"10.1.0.9:1", testToken, strings.Replace(reportBody(now, "gw1", 1), "tcp", "https", 1), 400, "probe_mismatch"},
	} {
		w := post(t, o, c.remote, c.token, c.body)
		if w.Code != c.status || !strings.Contains(w.Body.String(), `"error":"`+c.reason+`"`) {
			t.Errorf("%s: %d %s, want %d %s", c.body[:min(60, len(c.body))], w.Code, w.Body, c.status, c.reason)
		}
	}
}

func TestReportRateLimits(t *testing.T) {
	o := newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 0.001 2")
	now := time.Now()
	codes := []int{}
	for i := range 4 {
		codes = append(codes, post(t, o, fmt.Sprintf("10.1.0.%d:1", i+1), testToken, reportBody(now, "gw1", 5)).Code)
	}
	if fmt.Sprint(codes) != "[202 202 429 429]" {
		t.Fatalf("per token: %v", codes)
	}
	o = newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 0.001 2")
	codes = codes[:0]
	for range 3 {
		codes = append(codes, post(t, o, "10.1.0.1:1", "badbadbadbadbadbadbad", "").Code)
	}
	if fmt.Sprint(codes) != "[401 401 429]" {
		t.Fatalf("per source, before authentication: %v", codes)
	}
}
