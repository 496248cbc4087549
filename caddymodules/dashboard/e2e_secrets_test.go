package dashboard_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// selfSignedKeyPair writes a client certificate and its private key (PEM)
// under dir and returns their paths and a line of the key's base64 body.
func selfSignedKeyPair(t *testing.T, dir string) (certFile, keyFile, keyLine string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgesteer-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	// 40 characters of the key's base64: its private scalar, as any view
	// that carried the file's contents would show it.
	return certFile, keyFile, base64.StdEncoding.EncodeToString(kder)[8:48]
}

// TestNoSecretInAnyView configures every secret an edgesteer Caddy takes —
// edgesteer_redis username, password and sentinel_password (of a store in
// use against a real redis-server with an ACL user, and of a Sentinel
// store that cannot connect), a TLS client key, a password in a load
// source's URL, a basic_auth hash and its password — each holding a
// marker, and looks for the markers everywhere they could be shown: every
// edgesteer admin endpoint (and /edgesteer/views), the admin /metrics, the
// dashboard's api/state (its own views and a replica's: this Caddy), the
// page as Chromium renders it (text and DOM), and the process's log with
// access logging on. Only Caddy's own GET /config/ holds them (checked, so
// the test knows the markers were configured); the dashboard must not
// re-publish it.
func TestNoSecretInAnyView(t *testing.T) {
	e2e.SkipShort(t)
	dir := t.TempDir()
	_, redisAddr := e2e.StartRedis(t)
	const (
		user      = "es-MARKuser7q"
		password  = "MARKpw7q"
		password2 = "MARKpw2x7q"
		sentinel  = "MARKsentinel7q"
		promPW    = "MARKprom7q"
		basicPW   = "MARKbasic7q"
	)
	redisPort := redisAddr[strings.LastIndex(redisAddr, ":")+1:]
	if out, err := exec.Command("redis-cli", "-p", redisPort, "ACL", "SETUSER", user, "on", ">"+password, "~*", "+@all").CombinedOutput(); err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("redis ACL: %v %s", err, out)
	}
	certFile, keyFile, keyLine := selfSignedKeyPair(t, dir)
	out, err := e2e.CaddyCommand(t, "hash-password", "--plaintext", basicPW).Output()
	if err != nil {
		t.Fatal(err)
	}
	basicHash := strings.TrimSpace(string(out))
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# TYPE db_cpu_percent gauge\ndb_cpu_percent 40\n")
	}))
	t.Cleanup(exporter.Close)
	promURL := strings.Replace(exporter.URL, "http://", "http://scrape:"+promPW+"@", 1) + "/metrics"
	pub := e2e.Addr(t)
	dash, front, limited := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	config := fmt.Sprintf(`{
	auto_https off
	edgesteer_redis main {
		address %[2]s
		username %[3]s
		password %[4]s
		dial_timeout 200ms
	}
	edgesteer_redis sentinels {
		address %[5]s
		sentinel_master mymaster
		sentinel_password %[6]s
		password %[7]s
		tls_server_name redis.internal
		tls_cert_file %[8]s
		tls_key_file %[9]s
		dial_timeout 200ms
	}
}
http://%[10]s {
	log {
		output stderr
	}
	basic_auth {
		ops %[11]s
	}
	edgesteer_dashboard {
		replicas %[1]s
		sample_interval 300ms
		history 1m
	}
}
http://%[12]s {
	log {
		output stderr
	}
	reverse_proxy %[13]s {
		lb_policy latency_bucket {
			name secret-policy
			probe http /
			probe_interval 300ms
			sticky_user {http.request.header.X-User}
			sticky_store redis sentinels
		}
	}
}
http://%[13]s {
	respond "pub"
}
http://%[14]s {
	log {
		output stderr
	}
	peer_rate_limit {
		name secret-limiter
		profile peers {
			peer {http.request.header.X-Peer}
			rate 100
			dynamic
			cluster redis main {
				sync 250ms
			}
		}
		dynamic {
			source prometheus %[15]s db_cpu_percent
			interval 300ms
			threshold 30 20
		}
	}
	respond "ok"
}
`, "REPLICAS", redisAddr, user, password, e2e.Addr(t), sentinel, password2, certFile, keyFile,
		dash, basicHash, front, pub, limited, promURL)
	// The dashboard reads this Caddy's own admin API as a replica: known
	// once it runs, so a reload adds it (a reload in the middle, too).
	caddy := e2e.StartCaddy(t, "caddyfile", strings.Replace(config, "replicas REPLICAS", "", 1))
	for _, a := range []string{dash, front, limited} {
		caddy.WaitTCP(t, a)
	}
	admin := caddy.Admin
	caddy.Reload(t, "caddyfile", strings.Replace(config, "REPLICAS", "http://"+admin, 1))
	secrets := map[string]string{
		"edgesteer_redis username": user, "edgesteer_redis password": password, "the Sentinel store's password": password2,
		"sentinel_password": sentinel, "the TLS client key": keyLine, "the load source URL's password": promPW,
		"the basic_auth hash": basicHash, "the basic_auth password": basicPW,
		"the Authorization header": base64.StdEncoding.EncodeToString([]byte("ops:" + basicPW)),
	}

	// Traffic through everything that uses a secret: the sticky store (down),
	// the cluster limiter (Redis with the ACL user), the dashboard (basic_auth).
	get := func(url string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i := range 10 {
		get("http://"+front+"/", "X-User", fmt.Sprint("user-", i))
		get("http://"+limited+"/", "X-Peer", "pgw1")
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+basicPW))
	if code, _ := get("http://" + dash + "/api/state"); code != http.StatusUnauthorized {
		t.Errorf("api/state without credentials: %d, want 401", code)
	}
	var state string
	for deadline := time.Now().Add(60 * time.Second); ; {
		var code int
		code, state = get("http://"+dash+"/api/state", "Authorization", auth)
		if code == 200 && strings.Contains(state, `"reachable":true`) && strings.Contains(state, "secret-limiter") || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !strings.Contains(state, `"reachable":true`) {
		t.Errorf("the dashboard never read its replica (this Caddy's admin): %.500s", state)
	}

	views := map[string]string{"api/state": state}
	for _, path := range []string{"/edgesteer/views", "/latency_bucket/", "/peer_rate_limit/", "/tenant_route/",
		"/cache_redirect/", "/port_range/", "/reverse_proxy/upstreams", "/metrics"} {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		views["admin "+path] = string(b)
	}

	// The page, as Chromium renders it (with the credentials).
	b := newBrowser(t, 1280, 800)
	if _, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	b.navigate("http://" + dash + "/")
	b.moreRenders(3)
	var text, html string
	b.eval(`document.body.innerText`, &text)
	b.eval(`document.documentElement.outerHTML`, &html)
	if !strings.Contains(text, "secret-limiter") || !strings.Contains(text, "secret-policy") {
		t.Errorf("the page does not show the modules: %.500s", text)
	}
	views["page text"], views["page DOM"] = text, html
	// The markers were configured: Caddy's own config holds them (the
	// key's contents aside: the config names its file).
	resp, err := http.Get("http://" + admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for what, marker := range secrets {
		if what == "the TLS client key" || what == "the basic_auth password" || what == "the Authorization header" {
			continue
		}
		if !strings.Contains(string(cfg), marker) {
			t.Errorf("%s (%q) is not in the config: the test did not configure it", what, marker)
		}
	}
	caddy.Stop()
	views["log"] = caddy.Logs()

	for what, marker := range secrets {
		for where, body := range views {
			if strings.Contains(body, marker) {
				i := strings.Index(body, marker)
				t.Errorf("%s (%q) is shown in %s: …%s…", what, marker, where, body[max(0, i-120):min(len(body), i+len(marker)+40)])
			}
		}
	}
}
