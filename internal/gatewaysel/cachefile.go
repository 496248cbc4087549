package gatewaysel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// The cache file: what a restart keeps, and what deleting forces again.
// Reloads do not go through it: a reloaded configuration adopts the
// Table itself (Pool).
type fileData struct {
	Version int `json:"version"`
	// Probe and Gateways record what the RTTs measured, so that a restart
	// with another probe or other gateways applies Reconfigure's rules.
	Probe     string               `json:"probe,omitempty"`
	Gateways  map[string]string    `json:"gateways,omitempty"` // name → address
	Locations map[string]fileEntry `json:"locations"`
}

type fileEntry struct {
	At   time.Time          `json:"at"`
	RTTs map[string]float64 `json:"rtts_ms"` // by gateway name; absent: no result
	// Held and HoldUntil: the location's live hold (hold.go).
	Held      string    `json:"held,omitempty"`
	HoldUntil time.Time `json:"hold_until,omitzero"`
}

// Save writes every location's current result to path, atomically. Stale
// results (see Reconfigure) are left out.
func (s *Table) Save(path string) error {
	d := fileData{Version: 2, Gateways: map[string]string{}, Locations: map[string]fileEntry{}}
	s.mu.Lock()
	d.Probe = s.cfg.ProbeID
	for _, g := range s.cfg.Gateways {
		d.Gateways[g.Name] = g.Addr
	}
	for loc, e := range s.entries {
		if e.res == nil || e.epoch != s.epoch {
			continue
		}
		fe := fileEntry{At: e.res.At, RTTs: map[string]float64{}}
		if e.hold.live(s.now()) && !e.hold.reported {
			fe.Held, fe.HoldUntil = e.hold.gw, e.hold.until
		}
		for i, rtt := range e.res.RTTs {
			if rtt > 0 {
				fe.RTTs[e.res.Gateways[i].Name] = float64(rtt) / float64(time.Millisecond)
			}
		}
		d.Locations[loc] = fe
	}
	s.mu.Unlock()
	data, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ogs-cache-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Load reads path, if it exists, keeping the entries still inside their
// lifetime. Orders are recomputed from the stored RTTs against the current
// gateways, so a config change never resurrects a removed gateway; when the
// file was written with another probe, or lacks a gateway now configured
// (or had it at another address), its results load stale, as Reconfigure
// would leave them.
func (s *Table) Load(path string) (int, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var d fileData
	if err := json.Unmarshal(data, &d); err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	now := s.now()
	n := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	epoch := s.epoch
	if d.Probe != "" && d.Probe != s.cfg.ProbeID {
		epoch = 0
	}
	if d.Gateways != nil {
		for _, g := range s.cfg.Gateways {
			if d.Gateways[g.Name] != g.Addr {
				epoch = 0
			}
		}
	}
	for loc, fe := range d.Locations {
		if now.Sub(fe.At) >= s.cfg.CacheTTL || len(s.entries) >= s.cfg.MaxLocations {
			continue
		}
		rtts := make([]time.Duration, len(s.cfg.Gateways))
		any := false
		for i, g := range s.cfg.Gateways {
			if ms, ok := fe.RTTs[g.Name]; ok && ms > 0 {
				rtts[i] = time.Duration(ms * float64(time.Millisecond))
				any = true
			}
		}
		if !any {
			continue
		}
		res := &gatewayorder.Result{Gateways: s.cfg.Gateways, Order: gatewayorder.Order(s.cfg.Gateways, rtts, s.cfg.OmitUnmeasured), RTTs: rtts, At: fe.At}
		s.entries[loc] = &entry{res: res, epoch: epoch, lastUsed: now, hold: s.validHold(fe.Held, fe.HoldUntil, now)}
		n++
	}
	return n, nil
}

// requestSave asks the background loop to write the cache file.
func (s *Table) requestSave() {
	select {
	case s.saves <- struct{}{}:
	default:
	}
}

// persist saves new results to the configured cache file and watches it
// every interval: when the file, once present, is deleted, every location is
// forgotten and will be probed again. A reload may change the path; the loop
// follows it. It runs until Close.
func (s *Table) persist(interval time.Duration, watched string, present bool) {
	defer s.wg.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	follow := func() Config { // the path in force now, after any reload
		cfg := s.Config()
		if cfg.CacheFile != watched {
			watched = cfg.CacheFile
			_, err := os.Stat(watched)
			present = watched != "" && err == nil
		}
		return cfg
	}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.saves:
			cfg := follow()
			if watched == "" {
				continue
			}
			if err := s.Save(watched); err != nil {
				if cfg.OnError != nil {
					cfg.OnError(fmt.Errorf("saving %s: %v", watched, err))
				}
			} else {
				present = true
			}
		case <-tick.C:
			if follow(); watched == "" {
				continue
			}
			_, err := os.Stat(watched)
			switch {
			case err == nil:
				present = true
			case errors.Is(err, fs.ErrNotExist) && present:
				present = false
				s.Forget()
			}
		}
	}
}
