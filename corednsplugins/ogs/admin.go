package ogs

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// adminLocations bounds the locations one server lists (the newest
// results first); locations_total says how many there are.
const adminLocations = 1000

// admins are the HTTP listeners of ogs blocks by address: admin ones
// (the view, and reports unless a block has a reports listener) and reports
// ones (POST /ogs/reports only). Several ogs blocks may name one address
// for the same use: they share its listener, each listed as one server. A
// reload starts the new configuration before stopping the old, so the new
// blocks join the listener the old ones hold and it never closes in
// between; it closes when the last block using it stops.
var admins = struct {
	sync.Mutex
	m map[string]*adminListener
}{m: map[string]*adminListener{}}

// The listeners' uses, as their options are named.
const (
	kindAdmin   = "admin"
	kindReports = "reports"
)

type adminListener struct {
	kind string
	srv  *http.Server
	// blocks by state name: the configurations holding it, oldest first;
	// the newest answers (a reload registers the new block before the old
	// one lets go).
	blocks map[string][]*OGS
}

// adminAcquire registers o on its admin address and, with a reports
// listener, on that one, listening there if no block does yet.
func adminAcquire(o *OGS) error {
	if err := listenerAcquire(o, o.admin, kindAdmin, &o.adminOn); err != nil {
		return err
	}
	if o.reports != nil && o.reports.listen != "" {
		if err := listenerAcquire(o, o.reports.listen, kindReports, &o.reports.on); err != nil {
			listenerRelease(o, o.admin, &o.adminOn)
			return err
		}
	}
	return nil
}

// adminRelease takes o off its listeners.
func adminRelease(o *OGS) {
	listenerRelease(o, o.admin, &o.adminOn)
	if o.reports != nil {
		listenerRelease(o, o.reports.listen, &o.reports.on)
	}
}

// adminRestore makes o answer again after a failed reload.
func adminRestore(o *OGS) {
	listenerRestore(o, o.admin, o.adminOn)
	if o.reports != nil {
		listenerRestore(o, o.reports.listen, o.reports.on)
	}
}

// listenerAcquire registers o on addr for kind, listening there if no
// block does yet; on tells that o is registered. "" is no listener.
func listenerAcquire(o *OGS, addr, kind string, on *bool) error {
	if addr == "" {
		return nil
	}
	admins.Lock()
	defer admins.Unlock()
	l := admins.m[addr]
	if l != nil && l.kind != kind {
		return fmt.Errorf("%s %s: another ogs block's %s listener is there; give each use its own address", kind, addr, l.kind)
	}
	if l == nil {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s %s: %v", kind, addr, err)
		}
		l = &adminListener{kind: kind, blocks: map[string][]*OGS{}}
		mux := http.NewServeMux()
		if kind == kindAdmin {
			mux.HandleFunc("/ogs", l.serve)
		}
		mux.HandleFunc("/ogs/reports", l.serveReports)
		// ReadTimeout bounds a report's body in time as report_max_body does in size.
		l.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
		go l.srv.Serve(ln)
		admins.m[addr] = l
	}
	l.blocks[o.state] = append(l.blocks[o.state], o)
	*on = true
	return nil
}

// listenerRelease takes o off addr, and closes the listener when o was
// the last block on it.
func listenerRelease(o *OGS, addr string, on *bool) {
	admins.Lock()
	defer admins.Unlock()
	if !*on {
		return
	}
	*on = false
	l := admins.m[addr]
	if l == nil {
		return
	}
	if bs := slices.DeleteFunc(l.blocks[o.state], func(b *OGS) bool { return b == o }); len(bs) > 0 {
		l.blocks[o.state] = bs
	} else {
		delete(l.blocks, o.state)
	}
	if len(l.blocks) == 0 {
		delete(admins.m, addr)
		l.srv.Close()
	}
}

// listenerRestore makes o answer again on addr after a failed reload: the
// blocks the failed configuration registered after it are dropped.
func listenerRestore(o *OGS, addr string, on bool) {
	admins.Lock()
	defer admins.Unlock()
	l := admins.m[addr]
	if !on || l == nil {
		return
	}
	bs := l.blocks[o.state]
	if i := slices.Index(bs, o); i >= 0 {
		for _, b := range bs[i+1:] {
			if l.kind == kindAdmin {
				b.adminOn = false
			} else if b.reports != nil {
				b.reports.on = false
			}
		}
		l.blocks[o.state] = bs[:i+1]
	}
}

// The admin JSON (README, "Admin API").
type adminView struct {
	Servers []serverView `json:"servers"`
}

type serverView struct {
	Zone           string         `json:"zone"`
	Zones          []string       `json:"zones"`
	State          string         `json:"state"`
	Store          string         `json:"store"`
	RedisHealthy   *bool          `json:"redis_healthy,omitempty"`
	RedisTroubles  []troubleView  `json:"redis_troubles,omitempty"`
	Gateways       []gatewayView  `json:"gateways"`
	Locations      []locationView `json:"locations"`
	LocationsTotal int            `json:"locations_total"`
	LastRun        *time.Time     `json:"last_run"`
	RunsTotal      uint64         `json:"runs_total"`
	Reports        *reportsView   `json:"reports,omitempty"`
}

// reportsView is the client reports' state (README, "Reports"); no token
// appears, only their number.
type reportsView struct {
	WindowSeconds  float64              `json:"window_seconds"`
	MinReporters   int                  `json:"min_reporters"`
	MaxReporters   int                  `json:"max_reporters"`
	MaxPerToken    int                  `json:"max_reporters_per_token"`
	MaxLocations   int                  `json:"max_locations"`
	Probe          string               `json:"probe"`
	Tokens         int                  `json:"tokens"`
	TokensError    string               `json:"tokens_error,omitempty"`
	AcceptedTotal  uint64               `json:"accepted_total"`
	SharedViaStore bool                 `json:"shared"`                  // store redis: reports are shared with the other replicas
	StoreBacklog   *int                 `json:"store_backlog,omitempty"` // with store redis: reporters waiting to be written again after a store error
	StoreDropped   *uint64              `json:"store_dropped,omitempty"` // with store redis: reporters not queued (the backlog was full)
	LocationsTotal int                  `json:"locations_total"`
	Locations      []reportLocationView `json:"locations"`
}

type reportLocationView struct {
	Location   string             `json:"location"`
	Reporters  int                `json:"reporters"`
	LatestAt   time.Time          `json:"latest_at"`
	AgeSeconds float64            `json:"age_seconds"`
	Source     string             `json:"source"` // reports: enough reporters; probed: the plugin's probes answer
	Order      []string           `json:"order"`
	RTTsMs     map[string]float64 `json:"rtts_ms"`
}

type troubleView struct {
	Keys      string    `json:"keys"`
	Pattern   string    `json:"key_pattern"`
	Operation string    `json:"operation"`
	Reason    string    `json:"reason"`
	Error     string    `json:"error"`
	Since     time.Time `json:"since"`
}

type gatewayView struct {
	Name    string   `json:"name"`
	Address string   `json:"address"`
	Port    string   `json:"port"`
	Backups []string `json:"backups"`
}

type locationView struct {
	Location   string             `json:"location"`
	Order      []string           `json:"order"`
	RTTsMs     map[string]float64 `json:"rtts_ms"`
	ProbedAt   time.Time          `json:"probed_at"`
	AgeSeconds float64            `json:"age_seconds"`
	Fresh      bool               `json:"fresh"`
	Source     string             `json:"source"`
	Dead       []string           `json:"recheck_failed"`
}

func (l *adminListener) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	admins.Lock()
	var blocks []*OGS
	for _, bs := range l.blocks {
		blocks = append(blocks, bs[len(bs)-1])
	}
	admins.Unlock()
	view := adminView{Servers: []serverView{}}
	now := time.Now()
	for _, o := range blocks {
		if o.sel != nil {
			view.Servers = append(view.Servers, o.view(now))
		}
	}
	slices.SortFunc(view.Servers, func(a, b serverView) int { return strings.Compare(a.Zone+" "+a.State, b.Zone+" "+b.State) })
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(view)
}

// view is one block's state.
func (o *OGS) view(now time.Time) serverView {
	snap := o.sel.Snapshot(adminLocations)
	v := serverView{Zone: o.names[0], Zones: o.names, State: o.state, Store: "memory", Gateways: []gatewayView{},
		Locations: make([]locationView, 0, len(snap.Locations)), LocationsTotal: snap.Total, RunsTotal: snap.Runs}
	switch {
	case o.redis != nil:
		v.Store = "redis"
		healthy := snap.StoreUp
		v.RedisHealthy = &healthy
		v.RedisTroubles = []troubleView{}
		for _, t := range snap.Troubles {
			v.RedisTroubles = append(v.RedisTroubles, troubleView{Keys: t.Keys.String(), Pattern: o.store.keyPattern(t.Keys),
				Operation: t.Op, Reason: t.Reason, Error: truncate(t.Err, 200), Since: t.Since.UTC()})
		}
	case o.cfg.CacheFile != "":
		v.Store = "file"
	}
	if !snap.LastRun.IsZero() {
		t := snap.LastRun.UTC()
		v.LastRun = &t
	}
	for _, g := range snap.Gateways {
		_, port, _ := net.SplitHostPort(g.Addr)
		v.Gateways = append(v.Gateways, gatewayView{Name: g.Name, Address: g.IP.String(), Port: port, Backups: append([]string{}, g.Backups...)})
	}
	if o.reports != nil {
		v.Reports = o.reportsView(now)
	}
	for _, l := range snap.Locations {
		res := l.Result
		lv := locationView{Location: l.Location, Order: []string{}, RTTsMs: map[string]float64{}, ProbedAt: res.At.UTC(),
			AgeSeconds: math.Round(now.Sub(res.At).Seconds()*10) / 10, Fresh: l.Fresh, Source: "probed", Dead: []string{}}
		if l.FromReplica {
			lv.Source = "shared"
		}
		lv.Order = append(lv.Order, res.Names()...)
		for i, rtt := range res.RTTs {
			if rtt > 0 {
				lv.RTTsMs[res.Gateways[i].Name] = math.Round(float64(rtt)/float64(time.Millisecond)*10) / 10
			}
		}
		for i, why := range res.Dead {
			if why != "" {
				lv.Dead = append(lv.Dead, res.Gateways[i].Name)
			}
		}
		v.Locations = append(v.Locations, lv)
	}
	return v
}

// truncate bounds a store's error text in the view.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (o *OGS) reportsView(now time.Time) *reportsView {
	rs := o.sel.Reports().Snapshot(adminLocations, now)
	rv := &reportsView{WindowSeconds: rs.Config.Window.Seconds(), MinReporters: rs.Config.MinReporters, MaxReporters: rs.Config.MaxReporters,
		MaxPerToken: rs.Config.MaxTokenReporters, MaxLocations: rs.Config.MaxLocations, Probe: rs.Config.Probe, Tokens: o.reports.tokens.Len(), AcceptedTotal: rs.Accepted,
		LocationsTotal: rs.Total, Locations: make([]reportLocationView, 0, len(rs.Locations))}
	if err := o.reports.tokens.Err(); err != nil {
		rv.TokensError = truncate(err.Error(), 200)
	}
	if o.cfg.ReportStore != nil {
		waiting, dropped := o.sel.ReportBacklog()
		rv.SharedViaStore, rv.StoreBacklog, rv.StoreDropped = true, &waiting, &dropped
	}
	for _, l := range rs.Locations {
		lv := reportLocationView{Location: l.Location, Reporters: l.Reporters, LatestAt: l.Latest.UTC(),
			AgeSeconds: math.Round(now.Sub(l.Latest).Seconds()*10) / 10, Source: "probed", Order: []string{}, RTTsMs: map[string]float64{}}
		if res := l.Result; res != nil {
			lv.Source = "reports"
			lv.Order = append(lv.Order, res.Names()...)
			for i, rtt := range res.RTTs {
				if rtt > 0 {
					lv.RTTsMs[res.Gateways[i].Name] = math.Round(float64(rtt)/float64(time.Millisecond)*10) / 10
				}
			}
		}
		rv.Locations = append(rv.Locations, lv)
	}
	return rv
}
