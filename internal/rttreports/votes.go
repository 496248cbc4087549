package rttreports

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// VoteStore keeps client reports for every replica. A vote is one
// reporter's latest measurement of one gateway; a location's votes live
// for the report window after its latest write, and the store bounds the
// reporters per location and the locations in all, as the local table
// does.
type VoteStore interface {
	// PutVotes stores reporter's votes for location, each only where it is
	// not older than the stored vote of that reporter for that gateway;
	// latest is the reporter's newest measurement. The location's keys then
	// live ttl; its reporters are bounded by the rule of Reports (at most
	// b.PerToken of one token, the oldest of that token going, and at most
	// b.Reporters, the oldest of the token holding most going; reporter
	// itself stays), beyond b.Locations the location changed least
	// recently goes, and a location unchanged for ttl leaves the index.
	PutVotes(ctx context.Context, location, reporter string, votes []StoredVote, latest time.Time, ttl time.Duration, b Bounds) error
	// Changed returns at most limit locations changed at or after since (in
	// the store's clock, ms), oldest change first, each with its change's
	// time.
	Changed(ctx context.Context, since int64, limit int) ([]ChangedLocation, error)
	// Votes returns location's votes as stored: field → value (see
	// EncodeVote); the caller validates them.
	Votes(ctx context.Context, location string) (map[string]string, error)
}

// Bounds are the bounds a VoteStore keeps (Config's).
type Bounds struct{ Reporters, PerToken, Locations int }

// Bounds are c's bounds as a VoteStore keeps them.
func (c Config) Bounds() Bounds { return Bounds{c.MaxReporters, c.MaxTokenReporters, c.MaxLocations} }

// StoredVote is one vote as written to a VoteStore.
type StoredVote struct {
	Gateway string
	Value   string // EncodeVote's
	At      time.Time
}

// ChangedLocation is a location a VoteStore saw change, at (store clock, ms).
type ChangedLocation struct {
	Location string
	At       int64
}

// VoteField is a vote's field in the store: "REPORTER GATEWAY" (neither
// holds a space: token ids and gateway names are single words).
func VoteField(reporter, gateway string) string { return reporter + " " + gateway }

// EncodeVote is a vote's value in the store: its RTT in milliseconds ("-"
// for a failure) and its time in Unix milliseconds.
func EncodeVote(rtt time.Duration, failed bool, at time.Time) string {
	ms := "-"
	if !failed {
		ms = strconv.FormatFloat(float64(rtt)/float64(time.Millisecond), 'f', -1, 64)
	}
	return ms + " " + strconv.FormatInt(at.UnixMilli(), 10)
}

// decodeVote validates a stored vote like network input.
func decodeVote(field, value string, now time.Time) (reporter, gateway string, v vote, err error) {
	reporter, gateway, ok := strings.Cut(field, " ")
	if !ok || reporter == "" || gateway == "" || strings.Contains(gateway, " ") {
		return "", "", v, fmt.Errorf("field %q: want REPORTER GATEWAY", field)
	}
	ms, atS, ok := strings.Cut(value, " ")
	if !ok {
		return "", "", v, fmt.Errorf("value %q: want MS TIME", value)
	}
	atMs, err := strconv.ParseInt(atS, 10, 64)
	if err != nil || atMs <= 0 {
		return "", "", v, fmt.Errorf("value %q: bad time", value)
	}
	v.at = time.UnixMilli(atMs)
	if v.at.After(now.Add(ClockSkew)) {
		return "", "", v, fmt.Errorf("value %q: time in the future", value)
	}
	if ms == "-" {
		v.rtt = math.MaxInt64
		return reporter, gateway, v, nil
	}
	f, err := strconv.ParseFloat(ms, 64)
	if err != nil || math.IsNaN(f) || f <= 0 || f >= float64(MaxRTT/time.Millisecond) {
		return "", "", v, fmt.Errorf("value %q: RTT out of range", value)
	}
	v.rtt = time.Duration(f * float64(time.Millisecond))
	return reporter, gateway, v, nil
}

// Merge takes location's votes as a VoteStore holds them: each valid vote
// for a configured gateway inside the window replaces this table's vote of
// that reporter for that gateway unless that one is newer; the local bounds
// apply as for Add. It returns how many values were malformed (ignored).
func (r *Reports) Merge(location string, stored map[string]string, now time.Time) (malformed int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.cfg.Enabled {
		return 0, nil
	}
	var firstErr error
	var l *reportLocation
	for f, val := range stored {
		reporter, gw, v, err := decodeVote(f, val, now)
		if err != nil {
			malformed++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if _, ok := r.idx[gw]; !ok || !now.Before(v.at.Add(r.cfg.Window)) {
			continue // another configuration's gateway, or out of the window
		}
		if v.at.After(now) {
			v.at = now
		}
		if l == nil {
			l = r.location(location)
		}
		st := r.reporter(l, reporter)
		if old, ok := st.votes[gw]; ok && !old.at.Before(v.at) {
			continue
		}
		st.votes[gw] = v
		if v.at.After(st.latest) {
			st.latest = v.at
		}
		if v.at.After(l.latest) {
			l.latest = v.at
		}
		l.agg = nil
	}
	return malformed, firstErr
}

// StoredVotes is reporter's votes at location as a VoteStore takes them.
func (r *Reports) StoredVotes(location, reporter string) (votes []StoredVote, latest time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.locs[location]
	if l == nil || l.reporters[reporter] == nil {
		return nil, time.Time{}
	}
	st := l.reporters[reporter]
	for gw, v := range st.votes {
		votes = append(votes, StoredVote{Gateway: gw, Value: EncodeVote(v.rtt, v.rtt == math.MaxInt64, v.at), At: v.at})
	}
	return votes, st.latest
}
