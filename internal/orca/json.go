package orca

// parseJSON reads the JSON form: OrcaLoadReport in proto3's JSON mapping,
// e.g.
//
//	{"cpu_utilization": 0.3, "rps_fractional": 10, "named_metrics": {"foo": 123}}
//
// It is a scanner over the one shape this message has (an object of
// numbers and of objects of numbers), not encoding/json: that allocates
// per call, this does not (see BenchmarkParse). As protojson does, it
// takes both proto and lowerCamelCase field names, numbers also as JSON
// strings ("0.3"), and refuses unknown and repeated fields. Strings with
// backslash escapes are refused (ReasonSyntax): no field or sane metric
// name needs one, and decoding them would need a copy.
func parseJSON(s string, r *Report) Reason {
	p := jsonScanner{s: s}
	if !p.consume('{') {
		return ReasonSyntax
	}
	if p.consume('}') {
		return p.end()
	}
	for {
		key, ok := p.str()
		if !ok || !p.consume(':') {
			return ReasonSyntax
		}
		f, known := lookupField(key)
		if !known {
			return ReasonUnknownField
		}
		var why Reason
		if f.isM {
			why = p.object(f, r)
		} else {
			var v float64
			if v, why = p.number(); why == ReasonOK {
				why = r.setField(f.bit, v)
			}
		}
		if why != ReasonOK {
			return why
		}
		if p.consume('}') {
			return p.end()
		}
		if !p.consume(',') {
			return ReasonSyntax
		}
	}
}

type jsonScanner struct {
	s string
	i int
}

func (p *jsonScanner) skipSpace() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// consume skips whitespace and then c, if c is next.
func (p *jsonScanner) consume(c byte) bool {
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end accepts only whitespace after the closing brace.
func (p *jsonScanner) end() Reason {
	p.skipSpace()
	if p.i != len(p.s) {
		return ReasonSyntax
	}
	return ReasonOK
}

// str reads a string without escapes and returns its contents.
func (p *jsonScanner) str() (string, bool) {
	if !p.consume('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == '"':
			p.i++
			return p.s[start : p.i-1], true
		case c == '\\' || c < ' ':
			return "", false
		}
		p.i++
	}
	return "", false
}

// number reads a JSON number, or a number in a JSON string.
func (p *jsonScanner) number() (float64, Reason) {
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == '"' {
		q, ok := p.str()
		if !ok {
			return 0, ReasonSyntax
		}
		return parseNumber(q)
	}
	start := p.i
	for p.i < len(p.s) && isNumberByte(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		return 0, ReasonSyntax // true, null, [, {, or nothing
	}
	return parseNumber(p.s[start:p.i])
}

func isNumberByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// object reads a map field's object of name: number into r.
func (p *jsonScanner) object(f field, r *Report) Reason {
	if r.Has&f.bit != 0 {
		return ReasonDuplicate
	}
	r.Has |= f.bit
	if !p.consume('{') {
		return ReasonSyntax
	}
	if p.consume('}') {
		return ReasonOK
	}
	for {
		name, ok := p.str()
		if !ok || !p.consume(':') {
			return ReasonSyntax
		}
		v, why := p.number()
		if why != ReasonOK {
			return why
		}
		if why := r.addMetric(f.m, name, v); why != ReasonOK {
			return why
		}
		if p.consume('}') {
			return ReasonOK
		}
		if !p.consume(',') {
			return ReasonSyntax
		}
	}
}
