package loadsource

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const exposition = `# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 0.5
# TYPE db_cpu_percent gauge
db_cpu_percent{host="db1",zone="a"} 62
db_cpu_percent{host="db2",zone="b"} 12
# TYPE busy_total counter
busy_total{host="db1"} 7
untyped_load 33.5
# TYPE hot gauge
hot{host="db1"} 130
# TYPE req_seconds summary
req_seconds{quantile="0.5"} 0.1
req_seconds_sum 10
req_seconds_count 100
`

func TestPrometheusRead(t *testing.T) {
	var dynamic atomic.Uint64
	dynamic.Store(math.Float64bits(40))
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, exposition)
	})
	mux.HandleFunc("/dynamic", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE cpu gauge\ncpu{host=\"db1\"} %g\n", math.Float64frombits(dynamic.Load()))
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "<html>not metrics</html>\n")
	})
	mux.HandleFunc("/huge", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, exposition)
		fmt.Fprint(w, strings.Repeat("# filler\n", maxBodySize/9+1))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	tests := []struct {
		name    string
		path    string
		metric  string
		labels  map[string]string
		want    float64
		wantErr string
	}{
		{"label picks db1", "/metrics", "db_cpu_percent", map[string]string{"host": "db1"}, 62, ""},
		{"label picks db2", "/metrics", "db_cpu_percent", map[string]string{"host": "db2", "zone": "b"}, 12, ""},
		{"no labels takes first", "/metrics", "db_cpu_percent", nil, 62, ""},
		{"unlabelled gauge", "/metrics", "node_load1", nil, 0.5, ""},
		{"counter", "/metrics", "busy_total", map[string]string{"host": "db1"}, 7, ""},
		{"untyped", "/metrics", "untyped_load", nil, 33.5, ""},
		{"missing metric", "/metrics", "nope", nil, 0, "metric nope not found"},
		{"unmatched labels", "/metrics", "db_cpu_percent", map[string]string{"host": "db3"}, 0, `labels {host="db3"}`},
		{"half-matched labels", "/metrics", "db_cpu_percent", map[string]string{"host": "db1", "zone": "b"}, 0, `labels {host="db1",zone="b"}`},
		{"out of range", "/metrics", "hot", nil, 0, "load 130 out of range 0-100"},
		{"summary", "/metrics", "req_seconds", nil, 0, "type summary"},
		{"500", "/fail", "x", nil, 0, "status 500"},
		{"garbage", "/garbage", "x", nil, 0, "parsing body"},
		{"huge", "/huge", "db_cpu_percent", nil, 0, "body larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPrometheus(srv.URL+tt.path, tt.metric, tt.labels)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Read(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Read() = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), p.String()) {
					t.Errorf("error %q does not name the source %q", err, p)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Read() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}

	t.Run("value changes between reads", func(t *testing.T) {
		p, err := NewPrometheus(srv.URL+"/dynamic", "cpu", map[string]string{"host": "db1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []float64{40, 87.5, 0, 100} {
			dynamic.Store(math.Float64bits(want))
			got, err := p.Read(context.Background())
			if err != nil || got != want {
				t.Fatalf("Read() = %v, %v; want %v", got, err, want)
			}
		}
	})

	t.Run("cancelled context", func(t *testing.T) {
		p, _ := NewPrometheus(srv.URL+"/metrics", "node_load1", nil)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := p.Read(ctx); err == nil {
			t.Fatal("Read with cancelled context succeeded")
		}
	})
}

func TestNewPrometheus(t *testing.T) {
	tests := []struct {
		url, metric string
		labels      map[string]string
		wantErr     string // "" means valid
	}{
		{"http://127.0.0.1:9100/metrics", "node_cpu_busy", map[string]string{"instance": "db1"}, ""},
		{"https://example.com/metrics", "ns:cpu_percent", nil, ""},
		{"ftp://x", "m", nil, `url "ftp://x"`},
		{"not a url", "m", nil, `url "not a url"`},
		{"", "m", nil, `url ""`},
		{"http://", "m", nil, `url "http://"`},
		{"http://x/metrics", "1abc", nil, `metric "1abc"`},
		{"http://x/metrics", "", nil, `metric ""`},
		{"http://x/metrics", "m", map[string]string{"bad-label": "v"}, "labels"},
	}
	for _, tt := range tests {
		t.Run(tt.url+" "+tt.metric, func(t *testing.T) {
			p, err := NewPrometheus(tt.url, tt.metric, tt.labels)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewPrometheus() = %v, %v; want error containing %q", p, err, tt.wantErr)
			}
		})
	}
}

func TestPrometheusString(t *testing.T) {
	p, err := NewPrometheus("http://127.0.0.1:9100/metrics", "node_cpu_busy", map[string]string{"job": "node", "instance": "db1"})
	if err != nil {
		t.Fatal(err)
	}
	want := `prometheus http://127.0.0.1:9100/metrics node_cpu_busy{instance="db1",job="node"}`
	if got := p.String(); got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
}

// A source that accepts the scrape and never answers: Read gives up when
// the caller's context ends, with the context's error, and leaves no
// request behind on the server.
func TestPrometheusReadHungSource(t *testing.T) {
	held := make(chan struct{}, 1)
	gone := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-r.Context().Done()
		gone <- struct{}{}
	}))
	defer srv.Close()
	p, err := NewPrometheus(srv.URL, "cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := p.Read(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read of a hung source: %v, want the context's deadline", err)
	}
	<-held
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung request was left open on the server")
	}
}

// The configured URL is the only one fetched: a redirect is an error that
// names it, and its target gets no request. A password in the URL is not
// shown in the source's name (views, logs) or in a read error.
func TestPrometheusNoRedirectNoPassword(t *testing.T) {
	var hit atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit.Add(1)
		fmt.Fprint(w, "# TYPE cpu gauge\ncpu 99\n")
	}))
	defer target.Close()
	for _, code := range []int{301, 302, 307, 308} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+"/metrics", code)
		}))
		p, err := NewPrometheus(strings.Replace(srv.URL, "http://", "http://u:pw-marker@", 1), "cpu", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Read(context.Background())
		want := fmt.Sprintf("status %d %s → %s/metrics", code, http.StatusText(code), target.URL)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "pw-marker") {
			t.Errorf("%d: %v, want %q and no password", code, err, want)
		}
		if s := p.String(); strings.Contains(s, "pw-marker") || !strings.Contains(s, "u:xxxxx@") {
			t.Errorf("String() = %q", s)
		}
		srv.Close()
	}
	if n := hit.Load(); n != 0 {
		t.Errorf("the redirect target got %d requests", n)
	}
}
