package ogs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The cache file: what a restart keeps, and what deleting forces again.
type fileData struct {
	Version   int                  `json:"version"`
	Locations map[string]fileEntry `json:"locations"`
}

type fileEntry struct {
	At   time.Time          `json:"at"`
	RTTs map[string]float64 `json:"rtts_ms"` // by gateway name; absent: no result
}

// Save writes every location's result to path, atomically.
func (s *Selector) Save(path string) error {
	d := fileData{Version: 1, Locations: map[string]fileEntry{}}
	s.mu.Lock()
	for loc, e := range s.entries {
		if e.res == nil {
			continue
		}
		fe := fileEntry{At: e.res.At, RTTs: map[string]float64{}}
		for i, rtt := range e.res.RTTs {
			if rtt > 0 {
				fe.RTTs[s.cfg.Gateways[i].Name] = float64(rtt) / float64(time.Millisecond)
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
// gateways, so a config change never resurrects a removed gateway.
func (s *Selector) Load(path string) (int, error) {
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
		s.entries[loc] = &entry{res: &Result{Order: Order(s.cfg.Gateways, rtts, s.cfg.OmitUnmeasured), RTTs: rtts, At: fe.At}, lastUsed: now}
		n++
	}
	return n, nil
}

// Persist makes every new result be saved to path (errors go to onErr), and
// watches path every interval: when the file, once present, is deleted,
// every location is forgotten and will be probed again. It works in the
// background until ctx ends.
func (s *Selector) Persist(ctx context.Context, path string, interval time.Duration, onErr func(error)) {
	saves := make(chan struct{}, 1)
	s.mu.Lock()
	s.onStore = func() {
		select {
		case saves <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	_, err := os.Stat(path)
	go s.persist(ctx, path, interval, onErr, saves, err == nil)
}

func (s *Selector) persist(ctx context.Context, path string, interval time.Duration, onErr func(error), saves chan struct{}, present bool) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-saves:
			if err := s.Save(path); err != nil {
				onErr(err)
			} else {
				present = true
			}
		case <-tick.C:
			_, err := os.Stat(path)
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
