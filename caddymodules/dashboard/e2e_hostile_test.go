package dashboard_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// redirector answers every request with a redirect (code) to target: a
// replica or ogs URL that points somewhere else.
func redirector(t *testing.T, code int, target string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, code)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// hugeReplica answers /edgesteer/views with a JSON object of size bytes
// (never finished being read, if the reader is bounded). most is the most
// one answer got out before its write failed, the reader having hung up;
// 0 until then.
func hugeReplica(t *testing.T, size int) (url string, most *atomic.Int64) {
	most = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"cache_redirect":[`)
		chunk := []byte(strings.Repeat(`{"node":"x"},`, 4096))
		written := int64(0)
		for n := 0; n < size; n += len(chunk) {
			k, err := w.Write(chunk)
			written += int64(k)
			if err != nil {
				for m := most.Load(); written > m && !most.CompareAndSwap(m, written); m = most.Load() {
				}
				return
			}
		}
		io.WriteString(w, `{}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, most
}

// socketBuffers is the most two loopback TCP socket buffers may hold, one
// sending and one receiving: this host's tcp_wmem and tcp_rmem maxima
// (Linux's defaults, 4 MiB and 6 MiB, when they cannot be read).
func socketBuffers() int64 {
	most := func(path string, def int64) int64 {
		b, err := os.ReadFile(path)
		f := strings.Fields(string(b))
		if err != nil || len(f) != 3 {
			return def
		}
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return def
		}
		return n
	}
	return most("/proc/sys/net/ipv4/tcp_wmem", 4<<20) + most("/proc/sys/net/ipv4/tcp_rmem", 6<<20)
}

// viewsReplica answers /edgesteer/views with v.
func viewsReplica(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/edgesteer/views" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// hostile wraps a value in the characters that reorder or hide text:
// the isolates U+2066–2069, a zero-width space, a right-to-left override
// (U+202E) that is never closed, a zero-width joiner and a BOM. Shown raw
// in one text node, every figure after it on the line is mirrored.
func hostile(s string) string {
	return "\u2066\u2069\u2067\u2069\u2068\u2069\u200b\u202e" + s + "\u200d\ufeff"
}

// hostileChars are the characters hostile adds, as the page must show them.
var hostileChars = []string{`\u2066`, `\u2067`, `\u2068`, `\u2069`, `\u200B`, `\u202E`, `\u200D`, `\uFEFF`}

func plain(s string) string { return s }

// fakeViews is a replica's /edgesteer/views with tenant, user and peer
// values passed through name, and figures around them (as a tenant_route
// and a peer_rate_limit view have: max_per_node, partition_changes,
// unauthenticated_connections after a long DN that the page truncates).
func fakeViews(name func(string) string) map[string]any {
	type m = map[string]any
	return m{
		"tenant_route": []any{m{
			"name": name("directory"), "membership": "static", "membership_age_ms": 1500, "partitions": 2,
			"nodes":            []string{name("node-a"), "node-b"},
			"open_connections": m{name("node-a"): 3, "node-b": 5},
			"tenants": m{
				name("acme"): m{"nodes": []string{name("node-a"), "node-b"}, "connections": 4},
				name("beta"): m{"nodes": []string{"node-b"}, "connections": 2},
			},
			"partition_history": []any{m{"time": "2026-12-01T07:00:00Z", "tenant": name("acme"), "from": 1, "to": 2, "reason": "grow: 4 connections"}},
			"tenant_partitions": m{name("acme"): 2},
			"failed_binds":      m{name(strings.Repeat("uid=mallory,o=acme,", 12) + "dc=example"): 9},
			"last_user":         name("mallory"),
			"max_per_node":      3, "partition_changes": m{"grow": 7}, "unauthenticated_connections": 11,
		}},
		"peer_rate_limit": []any{m{
			"name": name("edge"), "kind": "http",
			"profiles": []any{m{"name": name("gateways-of-the-eastern-region"), "keys": 12, "limits": []any{m{
				"name": name("pgw"), "rate_per_second": 5, "burst": 3, "throttle_percent": 20,
				"effective_rate_per_second": 4, "effective_burst": 2}}}},
			"dynamic":   m{"load_percent": 55, "throttle_percent": 20, "source": "procstat", "last_error": name("peer pgw-7 slow")},
			"last_peer": name("pgw-7"), "peers_over_limit": 17,
		}},
	}
}

// figuresJS returns, for the card whose id starts with the given prefix,
// the figures (numbers) of its body in the order they are displayed, one
// string per block (a meta line or a table cell): by line, then left to
// right, as a reader sees them (so a block that wraps differently reads
// the same); the \uXXXX the page shows for invisible
// characters are not figures.
const figuresJS = `(function (prefix) {
  var card = Array.from(document.querySelectorAll('.card')).find(function (c) { return c.dataset.id.indexOf(prefix) === 0; });
  if (!card) return null;
  var out = [];
  card.children[1].querySelectorAll('div.meta, td, th').forEach(function (b) {
    var toks = [], w = document.createTreeWalker(b, NodeFilter.SHOW_TEXT), n;
    while ((n = w.nextNode())) {
      var re = /\\u[0-9A-F]{4}|\d+(?:\.\d+)?/g, m;
      while ((m = re.exec(n.data))) {
        if (m[0].charAt(0) === '\\') continue;
        var r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        var q = r.getBoundingClientRect();
        toks.push({t: m[0], top: q.top, left: q.left, h: q.height});
      }
    }
    toks.sort(function (a, b) { return a.top - b.top; });
    var lines = [];
    toks.forEach(function (k) {
      var L = lines[lines.length - 1];
      if (L && k.top - L.top < L.h / 2) L.items.push(k); else lines.push({top: k.top, h: k.h, items: [k]});
    });
    var seq = [];
    lines.forEach(function (L) { L.items.sort(function (a, b) { return a.left - b.left; }); L.items.forEach(function (k) { seq.push(k.t); }); });
    if (seq.length) out.push(seq.join(" "));
  });
  return out;
})`

// isolatedJS lists the text nodes of main that hold a shown invisible
// character (\uXXXX) and are not isolated from the text around them, and
// counts the text nodes with raw invisible characters.
const isolatedJS = `(function () {
  var bad = [], raw = 0, w = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT), n;
  while ((n = w.nextNode())) {
    if (/[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]/.test(n.data)) raw++;
    if (!/\\u(202E|206[6-9]|200B|200D|FEFF)/.test(n.data)) continue;
    // Isolated: inside an inline element whose unicode-bidi isolates it
    // from its neighbours, or alone in its block (block elements isolate
    // by default, but not from the text beside the value in the block).
    var e = n.parentElement, ok = false;
    for (; e && e !== document.body; e = e.parentElement) {
      var cs = getComputedStyle(e);
      if (cs.display.indexOf('inline') !== 0) { ok = e.textContent === n.data; break; }
      if (/isolate|plaintext/.test(cs.unicodeBidi)) { ok = true; break; }
    }
    if (!ok) bad.push(n.data.slice(0, 80));
  }
  return {notIsolated: bad, raw: raw};
})()`

// overflowJS lists the visible cards and table wrappers whose content is
// wider than they are.
const overflowJS = `Array.from(document.querySelectorAll('.card, .tablewrap')).filter(function (e) {
  return e.offsetParent !== null && e.scrollWidth > e.clientWidth;
}).map(function (e) {
  var c = e.closest('.card');
  return (e.classList.contains('card') ? 'card ' : 'table in card ') + JSON.stringify(c.dataset.id) + ': ' + e.scrollWidth + ' > ' + e.clientWidth;
})`

// checkHostileRemotes checks the page (its text at 1280 px is text) for
// the hostile remotes of TestDashboardInChromium: replicas 0–3 and ogs
// URLs 2–5 redirect (codes) to redirectTo, replica 4 answers 50 MB,
// replicas 5 and 6 are the clean and hostile twins.
func checkHostileRemotes(t *testing.T, b *browser, text, redirectTo string, codes []int, targetConns *atomic.Int64) {
	t.Helper()
	var rows []string
	b.eval(`Array.from(document.querySelectorAll('#panel-replicas tbody tr')).map(r => r.innerText)`, &rows)
	if len(rows) != 7 {
		t.Fatalf("the Replicas panel has %d rows, want 7: %q", len(rows), rows)
	}
	for i, code := range codes {
		want := fmt.Sprintf("unreachable: HTTP %d → %s", code, redirectTo)
		if !strings.Contains(rows[i], want) {
			t.Errorf("replica %d (answers %d): %q, want %q", i, code, rows[i], want)
		}
		var card string
		b.eval(fmt.Sprintf(`(function(){var c=Array.from(document.querySelectorAll('.card')).find(c=>c.dataset.id==="ogs\u001f%d");return c?c.innerText:""})()`, 2+i), &card)
		if !strings.Contains(card, want) {
			t.Errorf("ogs URL %d (answers %d): %q, want %q", 2+i, code, card, want)
		}
	}
	if n := targetConns.Load(); n != 0 {
		t.Errorf("the redirects' target got %d connections", n)
	}
	if want := "unreachable: answer larger than the 4194304-byte limit"; !strings.Contains(rows[4], want) {
		t.Errorf("the 50 MB replica: %q, want %q", rows[4], want)
	}

	// Invisible and bidi characters are shown (\u202E…), each value
	// isolated; none is left raw in the page.
	for _, ch := range hostileChars {
		if !strings.Contains(text, ch) {
			t.Errorf("the page does not show %s", ch)
		}
	}
	if want := `\u200B\u202Eevil\u200D\uFEFF`; !strings.Contains(text, want) {
		t.Errorf("the tenant bound through the router with bidi characters is not shown as %s", want)
	}
	var iso struct {
		NotIsolated []string
		Raw         int
	}
	b.eval(isolatedJS, &iso)
	if len(iso.NotIsolated) != 0 || iso.Raw != 0 {
		t.Errorf("values not isolated: %q; text nodes with raw invisible characters: %d", iso.NotIsolated, iso.Raw)
	}
	// The figures of the hostile twin's cards read as the clean twin's.
	for _, card := range []string{"tr", "prl"} {
		var cleanF, evilF []string
		b.eval(figuresJS+`("`+card+`\u001freplica\u001f5\u001f")`, &cleanF)
		b.eval(figuresJS+`("`+card+`\u001freplica\u001f6\u001f")`, &evilF)
		if len(cleanF) < 5 || !slices.Equal(cleanF, evilF) {
			t.Errorf("%s card: figures as displayed\n clean   %q\n hostile %q", card, cleanF, evilF)
		}
	}
}
