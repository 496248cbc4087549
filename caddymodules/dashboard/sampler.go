package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

// sep joins the parts of a series key (module, names, field): a control
// character no Caddyfile name or address holds.
const sep = "\x1f"

// maxFetchBytes bounds one answer of an ogs or replica URL: a longer
// answer is an error, and at most this much (plus one byte) is read.
const maxFetchBytes = 4 << 20

// maxFetchTimeout bounds one fetch (connection, TLS, headers and body),
// below sample_interval when that is shorter.
const maxFetchTimeout = 5 * time.Second

// maxLocation bounds the Location of a refused redirect as the error shows it.
const maxLocation = 200

// gaugeFields are the numeric view fields charted as they are; every
// numeric field whose name ends in _total is a counter, charted as a rate
// per second. Other numbers (configuration, ages) are shown, not charted.
var gaugeFields = map[string]bool{
	"latency_ms": true, "load_percent": true, "throttle_percent": true, "effective_rate_per_second": true,
	"sticky_entries": true, "keys": true, "ports_in_use": true, "buckets_serving": true,
}

// mapGauges are objects of name → number whose entries are each a gauge
// (open connections per node, RTT per gateway); the entries of an object
// whose name ends in _total are counters (requests per path).
var mapGauges = map[string]bool{"open_connections": true, "rtts_ms": true}

// moduleFields are fields charted in one module's view only, where the
// name means that (other views use the same names otherwise): the
// diameter_agent's counts are counters without the _total suffix.
var moduleFields = map[string]map[string]fieldKind{
	"diameter_agent": {
		"latency_ns": gaugeField, "outstanding": gaugeField, "pending": gaugeField, "bindings": gaugeField,
		"admitted": counterField, "refused": counterField, "busy": counterField, "unavailable": counterField,
		"failed_over": counterField, "timed_out": counterField,
	},
	// latency_bucket's publishers: what within p2c compares.
	"latency_bucket": {"in_flight": gaugeField, "cost_ms": gaugeField},
}

type fieldKind int

const (
	gaugeField fieldKind = iota + 1
	counterField
)

// skipped are fields keyed by client-controlled data: shown, never charted
// (downstreams: the diameter_agent's client peers, named by their CER).
var skipped = map[string]bool{"tenants": true, "last_rtts_ms": true, "downstreams": true}

// idFields name an object inside an array, in the series key (host: a
// diameter_agent peer, which also has an address).
var idFields = []string{"name", "host", "address", "node", "zone", "location", "path"}

// remote is the last answer of one ogs or replica URL.
type remote struct {
	URL       string    `json:"url"`
	Reachable bool      `json:"reachable"`
	Error     string    `json:"error,omitempty"`
	FetchedAt time.Time `json:"fetched_at,omitzero"`
	// Body is the last good answer: the last fetch's when Reachable, else
	// the one before (stale; BodyFetchedAt says how old).
	Body          json.RawMessage `json:"body,omitempty"`
	BodyFetchedAt time.Time       `json:"body_fetched_at,omitzero"`
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
		client:  fetchClient(min(interval, maxFetchTimeout)),
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
	s.client.CloseIdleConnections()
	return nil
}

// fetchClient is the client of every fetch: it goes only to the URL it is
// given (no redirect is followed: a 3xx is the answer, shown as an error;
// no proxy from the environment), and timeout bounds the whole exchange.
func fetchClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       time.Minute,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
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
			if tree := s.fetch(ctx, "ogs"+sep+u, u, ogsView); tree != nil {
				walk(shared, []string{"ogs", fmt.Sprint(i)}, tree, false)
			}
		}()
	}
	for i, u := range s.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tree := s.fetch(ctx, "replica"+sep+strings.TrimSuffix(u, "/"), strings.TrimSuffix(u, "/")+"/edgesteer/views", replicaViews); tree != nil {
				for name, v := range tree {
					walk(shared, []string{"replica", fmt.Sprint(i), name}, v, false)
				}
			}
		}()
	}
	wg.Wait()
	s.series.add(smp)
}

// fetch GETs one URL and keeps its answer, reduced by shape to what the
// page shows; it returns the decoded JSON, or nil (and keeps the error,
// and the last good answer as stale) when it could not be had.
func (s *sampler) fetch(ctx context.Context, key, url string, shape func(map[string]any) (map[string]any, error)) map[string]any {
	body, err := s.get(ctx, url)
	var tree map[string]any
	if err == nil {
		var v any
		if err = json.Unmarshal(body, &v); err == nil {
			if obj, ok := v.(map[string]any); !ok {
				err = errors.New("answer is not a JSON object")
			} else if tree, err = shape(obj); err == nil {
				body, err = json.Marshal(tree)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.remotes[key]
	r.FetchedAt = time.Now()
	if err != nil {
		r.Reachable, r.Error = false, err.Error()
		return nil
	}
	r.Reachable, r.Error, r.Body, r.BodyFetchedAt = true, "", body, r.FetchedAt
	return tree
}

// ogsView keeps the servers array of an ogs plugin's JSON view (all it
// has); an object without one is not an ogs view.
func ogsView(v map[string]any) (map[string]any, error) {
	servers, ok := v["servers"].([]any)
	if !ok {
		return nil, errors.New("answer is not an ogs view (no servers array)")
	}
	return map[string]any{"servers": servers}, nil
}

// replicaViews keeps the module views of a replica's /edgesteer/views
// answer: each is an array; an object with anything else is not that
// answer.
func replicaViews(v map[string]any) (map[string]any, error) {
	for name, view := range v {
		if _, ok := view.([]any); !ok {
			return nil, fmt.Errorf("answer is not an /edgesteer/views answer (%.40q is not an array)", name)
		}
	}
	return v, nil
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
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		loc := resp.Header.Get("Location")
		if loc == "" {
			loc = "(no Location)"
		} else if len(loc) > maxLocation {
			loc = strings.ToValidUTF8(loc[:maxLocation], "") + "…"
		}
		return nil, fmt.Errorf("HTTP %d → %s (redirects are not followed)", resp.StatusCode, loc)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	case resp.ContentLength > maxFetchBytes:
		return nil, fmt.Errorf("answer of %d bytes, more than the %d-byte limit", resp.ContentLength, maxFetchBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxFetchBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxFetchBytes {
		return nil, fmt.Errorf("answer larger than the %d-byte limit", maxFetchBytes)
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
// counters by their _total suffix, the entries of mapGauges objects, and
// the moduleFields of the module the path names (path[0], or path[2] for a
// replica's). Fields it does not know are left alone, so views may grow
// fields.
func walk(r recorder, path []string, v any, inArray bool) {
	module := path[0]
	if module == "replica" && len(path) > 2 {
		module = path[2]
	}
	walkFields(r, path, v, inArray, moduleFields[module])
}

func walkFields(r recorder, path []string, v any, inArray bool, own map[string]fieldKind) {
	switch t := v.(type) {
	case []any:
		for _, e := range t {
			walkFields(r, path, e, true, own)
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
				case gaugeFields[k] && !(k == "latency_ms" && unmeasured), own[k] == gaugeField:
					r.gauge(key, x)
				case own[k] == counterField:
					r.counter(key, x)
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
					walkFields(r, append(path[:len(path):len(path)], k), x, false, own)
				}
			case []any:
				walkFields(r, path, x, false, own)
			}
		}
	}
}
