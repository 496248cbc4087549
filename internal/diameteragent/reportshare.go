package diameteragent

import "github.com/edgesteer/edgesteer/internal/olrshare"

// Overload reports shared by replicas (Config.ReportStore, with DOIC on):
// the agent's table stays the only one requests read; internal/olrshare
// writes what the table takes to the store and merges the other
// replicas' reports into it, off the request's path.

// installReportStore makes, reconfigures or closes the reports' shared
// level as a configuration asks (a.mu held).
func (a *Agent) installReportStore(cfg *Config) {
	want := cfg.ReportStore
	if cfg.DOIC == nil {
		want = nil
	}
	s := a.reports.Load()
	switch {
	case want == nil && s != nil:
		a.reports.Store(nil)
		go s.Close()
	case want != nil && s == nil:
		a.reports.Store(olrshare.New(*want, a.oc.table, a.clock.Now, a.log))
	case want != nil:
		s.Configure(*want)
	}
}

// closeReportStore stops the reports' shared level.
func (a *Agent) closeReportStore() {
	if s := a.reports.Swap(nil); s != nil {
		s.Close()
	}
}
