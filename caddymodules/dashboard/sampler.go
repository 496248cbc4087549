package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

// sep joins the parts of a series key (module, names, field): a control
// character no Caddyfile name or address holds.
const sep = "\x1f"

// maxFetchBytes bounds one answer of an ogs or replica URL.
const maxFetchBytes = 4 << 20

// gaugeFields are the numeric view fields charted as they are; every
// numeric field whose name ends in _total is a counter, charted as a rate
// per second. Other numbers (configuration, ages) are shown, not charted.
var gaugeFields = map[string]bool{
	"latency_ms": true, "load_percent": true, "throttle_percent": true, "effective_rate_per_second": true,
	"sticky_entries": true, "keys": true, "ports_in_use": true,
}

// mapGauges are objects of name → number whose entries are each a gauge
// (open connections per node, RTT per gateway); the entries of an object
// whose name ends in _total are counters (requests per path).
var mapGauges = map[string]bool{"open_connections": true, "rtts_ms": true}

// skipped are fields keyed by client-controlled data: shown, never charted.
var skipped = map[string]bool{"tenants": true, "last_rtts_ms": true}

// idFields name an object inside an array, in the series key.
var idFields = []string{"name", "address", "node", "zone", "location", "path"}

// remote is the last answer of one ogs or replica URL.
type remote struct {
	URL       string          `json:"url"`
	Reachable bool            `json:"reachable"`
	Error     string          `json:"error,omitempty"`
	FetchedAt time.Time       `json:"fetched_at,omitzero"`
	Body      json.RawMessage `json:"body,omitempty"`
}

// sampler reads every registered module view (in process) and fetches the
// configured URLs every interval, into the series rings. It runs on its
// own goroutine: nothing here is on another module's request path beyond
// the views' own reads of their state.
type sampler struct {
	interval time.Duration
	series   *series
	client   *http.Client
	ogs      []string
	replicas []string

	mu      sync.Mutex
	remotes map[string]*remote // by "ogs"/"replica" + URL

	cancel context.CancelFunc
	done   chan struct{}
}

func newSampler(interval, history time.Duration, maxSeries int, ogs, replicas []string) *sampler {
	capacity := int(history / interval)
	s := &sampler{
		interval: interval, series: newSeries(capacity, maxSeries), ogs: ogs, replicas: replicas,
		client:  &http.Client{Timeout: min(interval, 5*time.Second)},
		remotes: map[string]*remote{}, done: make(chan struct{}),
	}
	for _, u := range ogs {
		s.remotes["ogs"+sep+u] = &remote{URL: u, Error: "not fetched yet"}
	}
	for _, u := range replicas {
		s.remotes["replica"+sep+strings.TrimSuffix(u, "/")] = &remote{URL: u, Error: "not fetched yet"}
	}
	return s
}

func (s *sampler) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			s.sampleOnce(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Destruct stops the sampler (caddy.Destructor: the pool calls it when no
// loaded config uses this sampler any more).
func (s *sampler) Destruct() error {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	return nil
}

func (s *sampler) sampleOnce(ctx context.Context) {
	smp := newSample(time.Now())
	for _, name := range views.Names() {
		v, ok := views.Get(name)
		if !ok {
			continue
		}
		var tree any
		if b, err := json.Marshal(v); err == nil && json.Unmarshal(b, &tree) == nil {
			walk(smp, []string{name}, tree, false)
		}
	}
	var wg sync.WaitGroup
	shared := smp.locked()
	for i, u := range s.ogs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tree := s.fetch(ctx, "ogs"+sep+u, u); tree != nil {
				walk(shared, []string{"ogs", fmt.Sprint(i)}, tree, false)
			}
		}()
	}
	for i, u := range s.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tree := s.fetch(ctx, "replica"+sep+strings.TrimSuffix(u, "/"), strings.TrimSuffix(u, "/")+"/edgesteer/views"); tree != nil {
				for name, v := range tree.(map[string]any) {
					walk(shared, []string{"replica", fmt.Sprint(i), name}, v, false)
				}
			}
		}()
	}
	wg.Wait()
	s.series.add(smp)
}

// fetch GETs one URL and keeps its answer; it returns the decoded JSON, or
// nil (and keeps the error) when it could not be had.
func (s *sampler) fetch(ctx context.Context, key, url string) any {
	body, err := s.get(ctx, url)
	var tree any
	if err == nil {
		if err = json.Unmarshal(body, &tree); err == nil {
			if _, ok := tree.(map[string]any); !ok {
				err, tree = errors.New("answer is not a JSON object"), nil
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.remotes[key]
	r.FetchedAt = time.Now()
	if err != nil {
		r.Reachable, r.Error, r.Body = false, err.Error(), nil
		return nil
	}
	r.Reachable, r.Error, r.Body = true, "", body
	return tree
}

func (s *sampler) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxFetchBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxFetchBytes {
		return nil, fmt.Errorf("answer larger than %d bytes", maxFetchBytes)
	}
	return body, nil
}

func (s *sampler) remoteList(kind string, urls []string) []remote {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]remote, 0, len(urls))
	for _, u := range urls {
		if kind == "replica" {
			u = strings.TrimSuffix(u, "/")
		}
		out = append(out, *s.remotes[kind+sep+u])
	}
	return out
}

// lockedSample lets concurrent fetches add readings to one sample.
type lockedSample struct {
	mu sync.Mutex
	s  *sample
}

func (s *sample) locked() recorder { return &lockedSample{s: s} }

func (l *lockedSample) gauge(k string, v float64) {
	l.mu.Lock()
	l.s.gauge(k, v)
	l.mu.Unlock()
}

func (l *lockedSample) counter(k string, v float64) {
	l.mu.Lock()
	l.s.counter(k, v)
	l.mu.Unlock()
}

type recorder interface {
	gauge(string, float64)
	counter(string, float64)
}

// walk records the chartable numbers of a view's JSON tree: gauges by name,
// counters by their _total suffix, and the entries of mapGauges objects.
// Fields it does not know are left alone, so views may grow fields.
func walk(r recorder, path []string, v any, inArray bool) {
	switch t := v.(type) {
	case []any:
		for _, e := range t {
			walk(r, path, e, true)
		}
	case map[string]any:
		if inArray {
			for _, f := range idFields {
				if id, ok := t[f].(string); ok && id != "" {
					path = append(path[:len(path):len(path)], id)
					break
				}
			}
		}
		unmeasured := t["measured"] == false
		for k, val := range t {
			if skipped[k] {
				continue
			}
			key := strings.Join(append(path[:len(path):len(path)], k), sep)
			switch x := val.(type) {
			case float64:
				switch {
				case strings.HasSuffix(k, "_total"):
					r.counter(key, x)
				case gaugeFields[k] && !(k == "latency_ms" && unmeasured):
					r.gauge(key, x)
				}
			case map[string]any:
				if counters := strings.HasSuffix(k, "_total"); counters || mapGauges[k] {
					for name, n := range x {
						if f, ok := n.(float64); !ok {
						} else if counters {
							r.counter(key+sep+name, f)
						} else {
							r.gauge(key+sep+name, f)
						}
					}
				} else {
					walk(r, append(path[:len(path):len(path)], k), x, false)
				}
			case []any:
				walk(r, path, x, false)
			}
		}
	}
}
