// Package dashboard is the Caddy HTTP handler http.handlers.edgesteer_dashboard:
// one page, embedded in the binary, that shows the live state of every
// edgesteer module of this Caddy (read in process from
// caddymodules/internal/views), time series the handler samples into
// bounded rings, and the JSON of configured CoreDNS ogs servers and other
// replicas, fetched server-side.
package dashboard

import (
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Handler{})
}

//go:embed assets
var assetFS embed.FS

// Defaults and bounds.
const (
	defaultInterval  = 2 * time.Second
	defaultHistory   = 15 * time.Minute
	defaultMaxSeries = 1000
	minInterval      = 100 * time.Millisecond
	maxSamples       = 10_000 // history / sample_interval
	maxMaxSeries     = 100_000
)

// samplers keeps one sampler per configuration across reloads, so the
// history survives a reload that does not change the dashboard.
var samplers = caddy.NewUsagePool()

// Handler serves the dashboard page (at the path it handles, ending in
// "/"), its assets (assets/<name>) and its data (api/state).
type Handler struct {
	// OGS are URLs of CoreDNS ogs plugins' JSON views, fetched by the
	// handler (never by the browser).
	OGS []string `json:"ogs,omitempty"`
	// Replicas are admin API addresses of other Caddys (edgesteer builds):
	// their GET /edgesteer/views is fetched by the handler.
	Replicas []string `json:"replicas,omitempty"`
	// SampleInterval between samples of the views (default 2s).
	SampleInterval caddy.Duration `json:"sample_interval,omitempty"`
	// History kept in the rings (default 15m).
	History caddy.Duration `json:"history,omitempty"`
	// MaxSeries bounds the number of time series (default 1000).
	MaxSeries int `json:"max_series,omitempty"`

	key     string
	sampler *sampler
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.edgesteer_dashboard",
		New: func() caddy.Module { return new(Handler) },
	}
}

func (h *Handler) fillDefaults() {
	if h.SampleInterval == 0 {
		h.SampleInterval = caddy.Duration(defaultInterval)
	}
	if h.History == 0 {
		h.History = caddy.Duration(defaultHistory)
	}
	if h.MaxSeries == 0 {
		h.MaxSeries = defaultMaxSeries
	}
}

// Validate checks the settings; errors name the option and the value.
func (h *Handler) Validate() error {
	h.fillDefaults()
	iv, hist := time.Duration(h.SampleInterval), time.Duration(h.History)
	switch {
	case iv < minInterval:
		return fmt.Errorf("edgesteer_dashboard: sample_interval %v: want at least %v", iv, minInterval)
	case hist < iv:
		return fmt.Errorf("edgesteer_dashboard: history %v: want at least sample_interval (%v)", hist, iv)
	case hist/iv > maxSamples:
		return fmt.Errorf("edgesteer_dashboard: history %v: at most %d samples (history / sample_interval %v)", hist, maxSamples, iv)
	case h.MaxSeries < 1 || h.MaxSeries > maxMaxSeries:
		return fmt.Errorf("edgesteer_dashboard: max_series %d: want 1 to %d", h.MaxSeries, maxMaxSeries)
	}
	for _, list := range []struct {
		name  string
		urls  []string
		check func(string) error
	}{{"ogs", h.OGS, checkURL}, {"replicas", h.Replicas, checkReplica}} {
		seen := map[string]bool{}
		for _, u := range list.urls {
			if err := list.check(u); err != nil {
				return fmt.Errorf("edgesteer_dashboard: %s %q: %v", list.name, u, err)
			}
			k := u
			if list.name == "replicas" {
				k = strings.TrimSuffix(u, "/")
			}
			if seen[k] {
				return fmt.Errorf("edgesteer_dashboard: %s %q: given twice", list.name, u)
			}
			seen[k] = true
		}
	}
	return nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("want an http or https URL")
	case u.Host == "":
		return fmt.Errorf("want a host")
	case u.User != nil:
		return fmt.Errorf("credentials in the URL are not supported")
	case u.Fragment != "":
		return fmt.Errorf("want no fragment")
	}
	return nil
}

// checkReplica: a replica is an admin API address, its path is fixed.
func checkReplica(s string) error {
	if err := checkURL(s); err != nil {
		return err
	}
	u, _ := url.Parse(s)
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery {
		return fmt.Errorf("want an admin API address (scheme://host:port): /edgesteer/views is read from it")
	}
	return nil
}

// Provision starts (or adopts) the sampler of this configuration.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.Validate(); err != nil {
		return err
	}
	k, _ := json.Marshal([]any{h.OGS, h.Replicas, h.SampleInterval, h.History, h.MaxSeries})
	h.key = string(k)
	v, _, err := samplers.LoadOrNew(h.key, func() (caddy.Destructor, error) {
		s := newSampler(time.Duration(h.SampleInterval), time.Duration(h.History), h.MaxSeries, h.OGS, h.Replicas)
		s.start()
		return s, nil
	})
	if err != nil {
		return err
	}
	h.sampler = v.(*sampler)
	return nil
}

// Cleanup lets go of the sampler; the last user stops it.
func (h *Handler) Cleanup() error {
	if h.key != "" {
		_, err := samplers.Delete(h.key)
		return err
	}
	return nil
}

// securityHeaders: the page loads nothing but its own assets and data.
func securityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-cache")
}

// ServeHTTP answers exactly three kinds of path, as the handler sees them
// (after handle_path stripped its prefix): "/" (the page),
// "/assets/<name>" and "/api/state"; anything else is 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return answerError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s: want GET or HEAD", echo(r.Method)))
	}
	securityHeaders(w)
	p := r.URL.Path
	switch {
	case p == "/api/state":
		return h.serveState(w, r)
	case strings.HasPrefix(p, "/assets/"):
		return serveAsset(w, r, strings.TrimPrefix(p, "/assets/"))
	case p == "/":
		return serveAsset(w, r, "index.html")
	}
	return answerError(w, http.StatusNotFound, fmt.Sprintf("no dashboard resource at %s: the dashboard answers /, /assets/<name> and /api/state", echo(p)))
}

// echo is a piece of the request (a path, a parameter or its value) as an
// error body may repeat it: quoted if it is at most 64 bytes of letters,
// digits and . _ - /, else "(not shown)". So a body, and the logs and pages
// that show it, never carry the client's markup, control bytes or forged
// log lines, whatever the request held.
func echo(s string) string {
	if len(s) > 64 {
		return "(not shown)"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._-/", c) >= 0) {
			return "(not shown)"
		}
	}
	return `"` + s + `"`
}

// answerError writes an error answer with a body that says what was wrong
// (as text: it is for whoever typed the URL).
func answerError(w http.ResponseWriter, code int, msg string) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, err := io.WriteString(w, msg+"\n")
	return err
}

func serveAsset(w http.ResponseWriter, r *http.Request, name string) error {
	if name == "" || strings.Contains(name, "/") || !fs.ValidPath(name) {
		return answerError(w, http.StatusNotFound, "no asset "+echo(name))
	}
	f, err := assetFS.Open(path.Join("assets", name))
	if err != nil {
		return answerError(w, http.StatusNotFound, "no asset "+echo(name))
	}
	defer f.Close()
	rs, ok := f.(interface {
		Read([]byte) (int, error)
		Seek(int64, int) (int64, error)
	})
	if !ok {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("asset %q not seekable", name))
	}
	if strings.HasSuffix(name, ".LICENSE") {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	http.ServeContent(w, r, name, time.Time{}, rs)
	return nil
}

// State is the JSON of api/state.
type State struct {
	GeneratedAt      time.Time                  `json:"generated_at"`
	SampleIntervalMS int64                      `json:"sample_interval_ms"`
	HistorySeconds   float64                    `json:"history_seconds"`
	Modules          map[string]json.RawMessage `json:"modules"`
	OGS              []remote                   `json:"ogs"`
	Replicas         []remote                   `json:"replicas"`
	Series           seriesView                 `json:"series"`
}

// serveState answers api/state[?window=<duration>]: the modules' views
// now, the last answers of the ogs and replica URLs, and the series of the
// last window (default: the whole history; 0s: none).
func (h *Handler) serveState(w http.ResponseWriter, r *http.Request) error {
	bad := func(msg string) error { return answerError(w, http.StatusBadRequest, "api/state: "+msg) }
	want := fmt.Sprintf("window=<duration> from 0s to the history (%v), e.g. window=30s", time.Duration(h.History))
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		// The parse error quotes the query: not repeated (see echo).
		return bad("the query does not parse; the one parameter accepted is " + want)
	}
	window := time.Duration(h.History)
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		if k != "window" {
			return bad(fmt.Sprintf("unknown parameter %s; the one parameter accepted is %s", echo(k), want))
		}
		if len(v) != 1 {
			return bad(fmt.Sprintf("parameter window given %d times; want it once: %s", len(v), want))
		}
		d, err := time.ParseDuration(v[0])
		if err != nil || d < 0 || d > time.Duration(h.History) {
			return bad(fmt.Sprintf("parameter window %s: want %s", echo(v[0]), want))
		}
		window = d
	}
	now := time.Now()
	st := State{
		GeneratedAt: now.UTC(), SampleIntervalMS: time.Duration(h.SampleInterval).Milliseconds(),
		HistorySeconds: time.Duration(h.History).Seconds(), Modules: map[string]json.RawMessage{},
		OGS: h.sampler.remoteList("ogs", h.OGS), Replicas: h.sampler.remoteList("replica", h.Replicas),
	}
	st.Modules = allViews()
	if window > 0 {
		st.Series = h.sampler.series.view(now.Add(-window))
	} else {
		st.Series = seriesView{TimesMS: []int64{}, Values: map[string][]*float64{}}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(st)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
