package latencybucket_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// accessLine is an access log line of the example publisher-selection.Caddyfile
// with its log_append fields.
type accessLine struct {
	Logger  string `json:"logger"`
	Request struct {
		Host    string              `json:"host"`
		Headers map[string][]string `json:"headers"`
	} `json:"request"`
	RespHeaders map[string][]string `json:"resp_headers"`
	User        string              `json:"lb_user"`
	App         string              `json:"lb_app"`
	Publisher   string              `json:"lb_publisher"`
	Bucket      string              `json:"lb_bucket"`
	Decision    string              `json:"lb_decision"`
	DecidedBy   string              `json:"lb_decided_by"`
}

// checkAccessLog checks the access log of TestHTTPNetskopeTableStickinessAndAdminView's
// requests: 200 users once each (new), then alice 101 times (new once, then
// sticky). Each line names the request's user (X-User),
// its app (the host), the publisher that answered (X-Peer publisher-i is
// pubs[i-1]), its bucket, and probe as the figure that decided it.
func checkAccessLog(t *testing.T, logs func() string, pubs []string) {
	t.Helper()
	// Caddy writes a request's line after its response has gone: the last
	// lines may come a moment after the client has its answer.
	var lines []accessLine
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		lines = accessLines(logs())
		if len(lines) >= 301 || time.Now().After(deadline) {
			break
		}
	}
	decisions := map[string]map[string]int{}
	for _, l := range lines {
		user := first(l.Request.Headers["X-User"])
		peer := first(l.RespHeaders["X-Peer"])
		var want string
		var i int
		if fmt.Sscanf(peer, "publisher-%d", &i); i >= 1 && i <= len(pubs) {
			want = pubs[i-1]
		}
		if user == "" || l.User != user || l.App != l.Request.Host || l.Publisher != want ||
			l.Bucket != "[0,32)" || l.DecidedBy != "probe" {
			t.Fatalf("access log line %+v: want user %q, app %q, publisher %q (%s), bucket [0,32), decided by probe",
				l, user, l.Request.Host, want, peer)
		}
		if decisions[user] == nil {
			decisions[user] = map[string]int{}
		}
		decisions[user][l.Decision]++
	}
	if len(lines) != 301 {
		t.Fatalf("%d access log lines with decisions, want 301", len(lines))
	}
	if d := decisions["alice"]; d["new"] != 1 || d["sticky"] != 100 {
		t.Fatalf("alice's decisions in the access log: %v, want 1 new and 100 sticky", d)
	}
	for u, d := range decisions {
		if u != "alice" && (d["new"] != 1 || len(d) != 1) {
			t.Fatalf("%s's decisions: %v, want one new", u, d)
		}
	}
}

func accessLines(logs string) []accessLine {
	var lines []accessLine
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l accessLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && strings.HasPrefix(l.Logger, "http.log.access") {
			lines = append(lines, l)
		}
	}
	return lines
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
