package dashboard_test

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// lbLoad is a latency_bucket card's load table (publisher → cells) and the
// meta line under it, as the page shows them.
type lbLoad struct {
	Rows   map[string][]string
	Meta   string
	Points map[string]int // chart (last part of its id) → data points
}

// checkPublisherLoad checks the load table of TestDashboardInChromium's
// front-policy (within p2c, slow_start 30s, ORCA read at once, both
// publishers echoing the X-Load request header as their
// endpoint-load-metrics): the proxied requests all carried
// cpu_utilization=0.4 but one garbage. A publisher that answered some
// (the admin view's orca_state fresh; which one did depends on whether the
// first probe round had ended) shows 0.40 and factor 1.67, one that
// answered none shows none and factor 1.00. Each row shows 0 in flight, a
// cost of estimate × factor and the slow start column; under the table
// the ORCA header counts of the admin view by outcome; the charts of the
// requests in flight and the cost have points.
func checkPublisherLoad(t *testing.T, b *browser, caddy *e2e.Caddy, pub1, pub2 string) {
	t.Helper()
	var views []latencybucket.PolicyView
	caddy.AdminJSON(t, "/latency_bucket/", &views)
	if len(views) != 1 || views[0].ORCA == nil || views[0].Within != "p2c" ||
		views[0].ORCA.Reports["ok"] == 0 || views[0].ORCA.Reports["bad_number"] != 1 {
		t.Fatalf("admin view: want front-policy within p2c with ORCA reports ok and one bad_number: %+v", views)
	}
	o := views[0].ORCA
	want := map[string][]string{}
	for _, pv := range views[0].Publishers {
		switch pv.ORCAState {
		case "fresh":
			want[pv.Address] = []string{"1.67", "fresh", "0.40"}
		case "none":
			want[pv.Address] = []string{"1.00", "none", "—", "—"}
		}
	}
	if len(want) != 2 || (len(want[pub1]) != 3 && len(want[pub2]) != 3) {
		t.Fatalf("admin view: want %s and %s, one at least with a fresh ORCA report, the other fresh or none: %+v", pub1, pub2, views[0].Publishers)
	}
	wantMeta := fmt.Sprintf("within p2c · slow start 30.0 s · ORCA blackout 0.0 s, expiration 600.0 s · headers absent %d · bad_number 1 · ok %d",
		o.Absent, o.Reports["ok"])
	slow := regexp.MustCompile(`^(done|warming \d+ %)$`)
	check := func(l lbLoad) string {
		if !strings.Contains(l.Meta, wantMeta) {
			return fmt.Sprintf("meta %q, want %q", l.Meta, wantMeta)
		}
		for pub, w := range want {
			r := l.Rows[pub]
			if len(r) != 9 || r[1] != "0" || strings.Join(r[4:4+len(w)], "|") != strings.Join(w, "|") || !slow.MatchString(r[8]) {
				return fmt.Sprintf("%s's row %q, want 9 cells: 0 in flight, %q from the load factor, a slow start", pub, r, w)
			}
			per, err1 := strconv.ParseFloat(r[2], 64)
			cost, err2 := strconv.ParseFloat(r[3], 64)
			factor, _ := strconv.ParseFloat(r[4], 64)
			// cost = per request × (0 + 1) × factor, each shown rounded
			// to 0.01 ms (a publisher on loopback: a probe latency of
			// 0.04 ms once showed as 0.0 with one decimal).
			if err1 != nil || err2 != nil || per < 0 || math.Abs(cost-per*factor) > 0.005*factor+0.006 {
				return fmt.Sprintf("%s's row %q: cost is not per request × factor", pub, r)
			}
		}
		for pub, w := range want {
			if age, err := strconv.ParseFloat(l.Rows[pub][7], 64); len(w) == 3 && (err != nil || age < 0) {
				return fmt.Sprintf("%s's ORCA age %q", pub, l.Rows[pub][7])
			}
		}
		if l.Points["inflight"] < 2 || l.Points["cost"] < 2 {
			return fmt.Sprintf("chart points %v, want in flight and cost charts", l.Points)
		}
		return ""
	}
	var l lbLoad
	for deadline := time.Now().Add(20 * time.Second); ; {
		b.eval(`(function(){var c=Array.from(document.querySelectorAll('.card')).find(c=>c.dataset.id.startsWith("lb"));
			var w=c?c.querySelectorAll('.tablewrap'):[];if(w.length<2)return {};
			var rows={};Array.from(w[1].querySelectorAll('tbody tr')).forEach(r=>{var cs=Array.from(r.cells).map(d=>d.innerText.trim());rows[cs[0]]=cs});
			return {Rows:rows, Meta:w[1].nextElementSibling?w[1].nextElementSibling.innerText:"",
				Points:Object.fromEntries(Array.from(c.querySelectorAll('[data-chart]')).map(x=>[x.dataset.chart.split('\u001f').pop(),Number(x.dataset.points)]))}})()`, &l)
		why := check(l)
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the publisher load table: %s", why)
		}
		b.moreRenders(1)
	}
}
