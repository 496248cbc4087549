package orca

import "strings"

// parseText reads the TEXT form: a flattened OrcaLoadReport as a
// comma-separated list of name=value, with map entries as
// "<map>.<key>=value", e.g.
//
//	cpu_utilization=0.3, rps_fractional=10, named_metrics.foo=123
//
// ':' is taken as the separator where a pair has no '=' (Envoy accepts
// both; its first release used ':'). Whitespace around items is optional
// and empty items are skipped, as for any HTTP list (RFC 9110 5.6.1).
func parseText(s string, r *Report) Reason {
	for s != "" {
		item := s
		if i := strings.IndexByte(s, ','); i >= 0 {
			item, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		item = trimOWS(item)
		if item == "" {
			continue
		}
		if why := textItem(item, r); why != ReasonOK {
			return why
		}
	}
	return ReasonOK
}

func textItem(item string, r *Report) Reason {
	sep := strings.IndexByte(item, '=')
	if sep < 0 {
		sep = strings.IndexByte(item, ':')
	}
	if sep < 0 {
		return ReasonSyntax
	}
	name, val := trimOWS(item[:sep]), trimOWS(item[sep+1:])
	v, why := parseNumber(val)
	if why != ReasonOK {
		return why
	}
	if dot := strings.IndexByte(name, '.'); dot >= 0 {
		f, ok := lookupField(name[:dot])
		if !ok || !f.isM {
			return ReasonUnknownField
		}
		return r.addMetric(f.m, name[dot+1:], v)
	}
	f, ok := lookupField(name)
	if !ok || f.isM {
		return ReasonUnknownField
	}
	return r.setField(f.bit, v)
}

// trimOWS drops HTTP's optional whitespace (space and tab) at both ends.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
