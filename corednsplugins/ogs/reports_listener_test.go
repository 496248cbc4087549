package ogs

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

// httpDo sends method url with the Authorization header auth ("": none)
// and returns the status and the body.
func httpDo(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// With `reports`, the report endpoint has a listener of its own that
// serves nothing else, and the admin listener takes no report; the Bearer
// scheme is matched case-insensitively (RFC 7235).
func TestReportsListenerApart(t *testing.T) {
	admin, reports := freeAddr(t), freeAddr(t)
	newPlugin(t, "admin "+admin+"\nreports "+reports+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 100 100")
	body := reportBody(time.Now(), "gw1", 5)
	for _, path := range []string{"/ogs", "/ogs/", "/", "/ogs?zone=vpn.example.test"} {
		if code, b := httpDo(t, http.MethodGet, "http://"+reports+path, "", ""); code != http.StatusNotFound || strings.Contains(b, "servers") {
			t.Errorf("GET %s on the reports listener: %d %q, want 404", path, code, b)
		}
	}
	if code, b := httpDo(t, http.MethodPost, "http://"+admin+"/ogs/reports", "Bearer "+testToken, body); code != http.StatusNotFound || !strings.Contains(b, `"error":"no_reports"`) {
		t.Errorf("a report on the admin listener: %d %s, want 404 no_reports", code, b)
	}
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		if code, b := httpDo(t, http.MethodPost, "http://"+reports+"/ogs/reports", scheme+" "+testToken, body); code != http.StatusAccepted {
			t.Errorf("%s on the reports listener: %d %s, want 202", scheme, code, b)
		}
	}
	if code, b := httpDo(t, http.MethodPost, "http://"+reports+"/ogs/reports", "Basic "+testToken, body); code != http.StatusUnauthorized {
		t.Errorf("Basic: %d %s, want 401", code, b)
	}
	if code, b := httpDo(t, http.MethodGet, "http://"+admin+"/ogs", "", ""); code != http.StatusOK || !strings.Contains(b, `"accepted_total":3`) {
		t.Errorf("the admin view: %d %s, want the three reports accepted", code, b)
	}
}

// The per-source limit and a reporter's identity are by source network:
// an IPv6 /64 (an address rotated inside it is the same source), an IPv4
// address; one token counts at most max_reporters_per_token reporters in a
// location however many /64s it reports from.
func TestReportSourceNetworks(t *testing.T) {
	o := newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 0.001 2")
	codes := []int{}
	for _, src := range []string{"[2001:db8:0:1::1]:1", "[2001:db8:0:1::2]:1", "[2001:db8:0:1:ffff::3]:1", "[2001:db8:0:2::1]:1", "10.1.0.1:1", "10.1.0.2:1"} {
		codes = append(codes, post(t, o, src, "badbadbadbadbadbadbad", "").Code)
	}
	if fmt.Sprint(codes) != "[401 401 429 401 401 401]" {
		t.Fatalf("per source network: %v, want the third address of one /64 limited", codes)
	}
	o = newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 1000 1000\nprefix 24 56\nmax_reporters_per_token 3")
	now := time.Now()
	var last string
	for i := range 3 { // three addresses of one /64: one reporter
		w := post(t, o, fmt.Sprintf("[2001:db8:0:1::%d]:1", i+1), testToken, reportBody(now, "gw1", 5))
		if last = w.Body.String(); w.Code != http.StatusAccepted || !strings.Contains(last, `"reporter":"alice|2001:db8:0:1::/64"`) {
			t.Fatalf("%d %s", w.Code, last)
		}
	}
	if !strings.Contains(last, `"reporters":1,`) {
		t.Fatalf("three addresses of one /64 counted as several reporters: %s", last)
	}
	for i := range 20 { // twenty /64s of one /56, one token: three reporters
		w := post(t, o, fmt.Sprintf("[2001:db8:0:%x::1]:1", i+2), testToken, reportBody(now, "gw1", 5))
		last = w.Body.String()
	}
	if !strings.Contains(last, `"location":"2001:db8::/56"`) || !strings.Contains(last, `"reporters":3,`) {
		t.Fatalf("one token from twenty /64s: %s, want 3 reporters", last)
	}
}

// The source behind trusted proxies is the right-most X-Forwarded-For
// address that is not a trusted proxy: what the client wrote on the left
// is not believed.
func TestReportForwardedForRightmost(t *testing.T) {
	o := newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 100 100\ntrusted_proxies 192.0.2.100/31")
	now := time.Now()
	for _, hdr := range [][]string{
		{"X-Forwarded-For", "10.9.9.9, 10.1.0.3"},
		{"X-Forwarded-For", "10.9.9.9, 10.1.0.3, 192.0.2.101"},
		{"X-Forwarded-For", "10.9.9.9", "X-Forwarded-For", "10.1.0.3"},
	} {
		w := post(t, o, "192.0.2.100:1", testToken, reportBody(now, "gw1", 5), hdr...)
		if !strings.Contains(w.Body.String(), `"location":"10.1.0.0/24"`) {
			t.Errorf("%q: %d %s, want location 10.1.0.0/24", hdr, w.Code, w.Body)
		}
	}
}

// A body without Content-Length (chunked) is bounded while it is read: a
// valid report padded past report_max_body is refused with 413.
func TestReportChunkedBodyBounded(t *testing.T) {
	o := newPlugin(t, "admin "+freeAddr(t)+"\nreport_tokens "+tokensFile(t)+"\nreport_rate 100 100\nreport_max_body 512")
	body := strings.Repeat(" ", 2048) + reportBody(time.Now(), "gw1", 5)
	req := httptest.NewRequest(http.MethodPost, "/ogs/reports", io.MultiReader(strings.NewReader(body)))
	req.ContentLength, req.TransferEncoding = -1, []string{"chunked"}
	req.RemoteAddr = "10.1.0.1:1"
	req.Header.Set("Authorization", "Bearer "+testToken)
	w := httptest.NewRecorder()
	o.serveReport(w, req)
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), `"error":"too_large"`) {
		t.Fatalf("a chunked body of %d bytes: %d %s, want 413 too_large", len(body), w.Code, w.Body)
	}
}

// A reload (the new block starts before the old one stops) hands the
// reports listener over without closing it; it closes with the last block
// on it. An address used as one block's reports listener cannot be
// another's admin listener.
func TestReportsListenerAcrossReload(t *testing.T) {
	admin, reports := freeAddr(t), freeAddr(t)
	extra := "admin " + admin + "\nreports " + reports + "\nreport_tokens " + tokensFile(t) + "\nreport_rate 100 100"
	old := newPlugin(t, extra)
	next := newPlugin(t, extra) // same state: a reload's new configuration
	old.stop()
	body := reportBody(time.Now(), "gw1", 5)
	if code, b := httpDo(t, http.MethodPost, "http://"+reports+"/ogs/reports", "Bearer "+testToken, body); code != http.StatusAccepted {
		t.Fatalf("after the old block stopped: %d %s, want 202", code, b)
	}
	c, err := parse(caddy.NewTestController("dns", "ogs other.example.test {\ngateway gw1 192.0.2.1:1\nadmin "+reports+"\n}"))
	if err != nil {
		t.Fatal(err)
	}
	c.state = t.Name() + " other"
	if err := c.start(); err == nil || !strings.Contains(err.Error(), "admin "+reports+": another ogs block's reports listener is there") {
		c.stop()
		t.Fatalf("admin on a reports listener's address: %v", err)
	}
	next.stop()
	if _, err := http.Get("http://" + reports + "/ogs/reports"); err == nil {
		t.Fatal("the reports listener still answers after its last block stopped")
	}
}
