package rttreports

import (
	"strings"
	"time"
)

// Reporters per location and per token (README, "Bounds"): a reporter is
// "TOKEN_ID|NETWORK", and one token's reporters are bounded so that a token
// reporting from many networks of one location pushes out its own
// reporters, not those of other tokens.

// ReporterToken is the token id of a reporter "TOKEN_ID|NETWORK" (token
// ids hold no '|').
func ReporterToken(reporter string) string {
	id, _, _ := strings.Cut(reporter, "|")
	return id
}

// evictOldestReporter drops l's least recent reporter of token ("": of
// any token).
func evictOldestReporter(l *reportLocation, token string) {
	var victim string
	var oldest time.Time
	for k, st := range l.reporters {
		if token != "" && ReporterToken(k) != token {
			continue
		}
		if victim == "" || st.latest.Before(oldest) {
			victim, oldest = k, st.latest
		}
	}
	delete(l.reporters, victim)
}

func (r *Reports) tokenReporters(l *reportLocation, token string) (n int) {
	for k := range l.reporters {
		if ReporterToken(k) == token {
			n++
		}
	}
	return n
}

// busiestToken is the token holding most reporters in l, newcomer's token
// counted once more (a tie goes to newcomer: it pushes out its own).
func busiestToken(l *reportLocation, newcomer string) string {
	count := map[string]int{}
	if newcomer != "" {
		count[newcomer] = 1
	}
	for k := range l.reporters {
		count[ReporterToken(k)]++
	}
	best, most := newcomer, count[newcomer]
	for tok, n := range count {
		if n > most || (n == most && best != newcomer && tok < best) {
			best, most = tok, n
		}
	}
	if count[best] == 1 && newcomer != "" && best == newcomer {
		return "" // every token holds one: the least recent reporter goes
	}
	return best
}
