// Command ratios reads `go test -bench` output (several -count runs) and
// prints, per benchmark group, the median ns/op of each implementation and
// its ratio to the group's anchors, measured in the same run.
//
// Naming convention: Benchmark<Topic>/<impl>[/<params>...]; an impl whose
// name starts with "anchor_" is an anchor (e.g. anchor_least_conn), the
// rest are ours. A group is the topic plus params.
//
//	go test -run '^$' -bench . -benchmem -count 5 ./... | go run ./bench/ratios
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

type sample struct{ nsPerOp, bytesPerOp, allocsPerOp []float64 }

type key struct{ group, impl string }

// parse collects samples per (group, impl) from benchmark lines.
func parse(r io.Reader) (map[key]*sample, []key, error) {
	samples := map[key]*sample{}
	var order []key
	sc := bufio.NewScanner(r)
	pending := "" // a benchmark name whose result a log line pushed down
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") && (len(f) < 4 || f[3] != "ns/op") {
			pending = f[0]
			continue
		}
		if len(f) >= 3 && pending != "" && f[2] == "ns/op" {
			f = append([]string{pending}, f...)
		}
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || f[3] != "ns/op" {
			continue
		}
		pending = ""
		name := f[0]
		if i := strings.LastIndex(name, "-"); i > 0 { // strip the -GOMAXPROCS suffix
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		parts := strings.Split(name, "/")
		if len(parts) < 2 {
			continue // no impl segment: not a comparison
		}
		k := key{group: strings.Join(append([]string{parts[0]}, parts[2:]...), "/"), impl: parts[1]}
		s := samples[k]
		if s == nil {
			s = &sample{}
			samples[k] = s
			order = append(order, k)
		}
		ns, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("%q: %v", sc.Text(), err)
		}
		s.nsPerOp = append(s.nsPerOp, ns)
		for i := 4; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "B/op":
				s.bytesPerOp = append(s.bytesPerOp, v)
			case "allocs/op":
				s.allocsPerOp = append(s.allocsPerOp, v)
			}
		}
	}
	return samples, order, sc.Err()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func report(w io.Writer, samples map[key]*sample, order []key) {
	groups := map[string][]key{}
	var groupOrder []string
	for _, k := range order {
		if _, ok := groups[k.group]; !ok {
			groupOrder = append(groupOrder, k.group)
		}
		groups[k.group] = append(groups[k.group], k)
	}
	for _, g := range groupOrder {
		var anchors []key
		for _, k := range groups[g] {
			if strings.HasPrefix(k.impl, "anchor_") {
				anchors = append(anchors, k)
			}
		}
		fmt.Fprintf(w, "%s\n", g)
		for _, k := range groups[g] {
			s := samples[k]
			ns := median(s.nsPerOp)
			fmt.Fprintf(w, "  %-28s %10.1f ns/op %8.0f B/op %6.0f allocs/op  (n=%d)", k.impl, ns,
				median(s.bytesPerOp), median(s.allocsPerOp), len(s.nsPerOp))
			for _, a := range anchors {
				if a != k {
					fmt.Fprintf(w, "  %.2fx %s", ns/median(samples[a].nsPerOp), a.impl)
				}
			}
			fmt.Fprintln(w)
		}
	}
}

func main() {
	samples, order, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratios:", err)
		os.Exit(1)
	}
	report(os.Stdout, samples, order)
}
