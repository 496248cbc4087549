package diameter

import "strings"

// LookupFold finds key in m (whose keys are lowercase), ignoring ASCII
// case as Diameter identities and realms compare, without allocating when
// key is lowercase already (they mostly are).
func LookupFold[V any](m map[string]V, key []byte) (V, bool) {
	if v, ok := m[string(key)]; ok {
		return v, true
	}
	var buf [256]byte
	if len(key) > len(buf) {
		v, ok := m[strings.ToLower(string(key))]
		return v, ok
	}
	low := buf[:len(key)]
	changed := false
	for i, c := range key {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
			changed = true
		}
		low[i] = c
	}
	if !changed {
		var zero V
		return zero, false
	}
	v, ok := m[string(low)]
	return v, ok
}
