package dashboard

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// series keeps the dashboard's time series: one ring of sample times shared
// by every series, and one ring of values per series key, all of the same
// capacity (history / sample_interval). Memory is bounded by
// maxSeries × capacity × 8 bytes: a key beyond maxSeries is dropped (and
// counted), and a series with no value in the whole window is forgotten.
type series struct {
	mu      sync.Mutex
	cap     int
	max     int
	times   []int64 // unix milliseconds; ring, next write at head
	head    int
	n       int // samples held (≤ cap)
	values  map[string][]float64
	dropped uint64
	// last counter readings, for rates
	counters map[string]counterReading
}

type counterReading struct {
	value float64
	at    time.Time
}

func newSeries(capacity, maxSeries int) *series {
	return &series{cap: capacity, max: maxSeries, times: make([]int64, capacity),
		values: map[string][]float64{}, counters: map[string]counterReading{}}
}

// sample is one round of readings, gauges and counters by key.
type sample struct {
	at       time.Time
	gauges   map[string]float64
	counters map[string]float64
}

func newSample(at time.Time) *sample {
	return &sample{at: at, gauges: map[string]float64{}, counters: map[string]float64{}}
}

func (s *sample) gauge(key string, v float64)   { s.gauges[key] = v }
func (s *sample) counter(key string, v float64) { s.counters[key] = v }

// add records one sample: gauges as they are, counters as the rate per
// second since the previous reading of the same counter (none for the first
// reading, or after the counter went down: a restart or a new generation).
func (s *series) add(smp *sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot := s.head
	s.times[slot] = smp.at.UnixMilli()
	s.head = (s.head + 1) % s.cap
	if s.n < s.cap {
		s.n++
	}
	for _, ring := range s.values {
		ring[slot] = math.NaN()
	}
	put := func(key string, v float64) {
		ring, ok := s.values[key]
		if !ok {
			if len(s.values) >= s.max {
				s.dropped++
				return
			}
			ring = make([]float64, s.cap)
			for i := range ring {
				ring[i] = math.NaN()
			}
			s.values[key] = ring
		}
		ring[slot] = v
	}
	// In key order, so which keys get in under max is stable.
	for _, k := range slices.Sorted(maps.Keys(smp.gauges)) {
		put(k, smp.gauges[k])
	}
	seen := make(map[string]bool, len(smp.counters))
	for k, v := range smp.counters {
		seen[k] = true
		prev, ok := s.counters[k]
		if _, tracked := s.counters[k]; !tracked && len(s.counters) >= s.max {
			continue
		}
		s.counters[k] = counterReading{v, smp.at}
		if dt := smp.at.Sub(prev.at).Seconds(); ok && v >= prev.value && dt > 0 {
			put(k, (v-prev.value)/dt)
		}
	}
	for k := range s.counters {
		if !seen[k] {
			delete(s.counters, k)
		}
	}
	// Forget series with no value left in the window.
	for k, ring := range s.values {
		if !slices.ContainsFunc(ring[:s.n], func(f float64) bool { return !math.IsNaN(f) }) {
			delete(s.values, k)
		}
	}
}

// seriesView is the JSON of the time series: sample times and, per key,
// the values at those times (null where the series had none).
type seriesView struct {
	TimesMS []int64               `json:"times_ms"`
	Values  map[string][]*float64 `json:"values"`
	Dropped uint64                `json:"dropped_series"`
}

// view returns the samples taken at or after since, oldest first.
func (s *series) view(since time.Time) seriesView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := seriesView{TimesMS: []int64{}, Values: map[string][]*float64{}, Dropped: s.dropped}
	start := (s.head - s.n + s.cap) % s.cap
	var slots []int
	for i := range s.n {
		slot := (start + i) % s.cap
		if s.times[slot] >= since.UnixMilli() {
			slots = append(slots, slot)
			out.TimesMS = append(out.TimesMS, s.times[slot])
		}
	}
	for k, ring := range s.values {
		vals := make([]*float64, len(slots))
		any := false
		for i, slot := range slots {
			if v := ring[slot]; !math.IsNaN(v) {
				vals[i] = &v
				any = true
			}
		}
		if any {
			out.Values[k] = vals
		}
	}
	return out
}
