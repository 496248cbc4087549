package placement

import (
	"strings"
	"testing"
	"time"
)

// Explain tells where Reserve would send the next connection, and why,
// without counting it: by least connections, past cooling-off nodes, with
// the source of k.
func TestExplainMatchesReserve(t *testing.T) {
	p, _ := New(2)
	ns := nodes(4)
	p.SetNodes(ns)
	p.Configure(2, map[string]int{"bigcorp": 3})
	now := time.Now()
	own := Rank("acme", ns)[:2]

	e := p.Explain("acme", now)
	if e.Partitions != 2 || e.Source != SourceDefault || e.Members != 4 || len(e.Nodes) != 2 ||
		e.Nodes[0].Node != own[0] || e.Nodes[1].Rank != 2 || e.Next != own[0] {
		t.Fatalf("idle: %+v (own %v)", e, own)
	}
	for range 3 {
		p.Explain("acme", now)
	}
	if c := p.Conns(); c[own[0]] != 0 {
		t.Fatalf("Explain counted a connection: %v", c)
	}
	// Each explanation names what Reserve then takes.
	for range 7 {
		want := p.Explain("acme", now).Next
		if got, _ := p.Reserve("acme", now); got != want {
			t.Fatalf("Explain said %s, Reserve took %s", want, got)
		}
	}
	if e := p.Explain("acme", now); e.Nodes[0].OpenConnections+e.Nodes[1].OpenConnections != 7 ||
		!strings.Contains(e.Reason, "fewest open connections") {
		t.Fatalf("after 7: %+v", e)
	}
	p.MarkDown(own[0], now.Add(time.Minute))
	p.MarkDown(own[1], now.Add(time.Minute))
	if e := p.Explain("acme", now); e.Next != Rank("acme", ns)[2] || e.Nodes[0].CoolOffUntil.IsZero() ||
		!strings.Contains(e.Reason, "cooling off") {
		t.Fatalf("own nodes down: %+v", e)
	}
	if e := p.Explain("bigcorp", now); e.Source != SourceConfig || e.Partitions != 3 || len(e.Nodes) != 3 {
		t.Fatalf("bigcorp: %+v", e)
	}
	p.SetPartitions("bigcorp", 1)
	if e := p.Explain("bigcorp", now); e.Source != SourceRuntime || len(e.Nodes) != 1 {
		t.Fatalf("bigcorp at run time: %+v", e)
	}
	p.SetNodes(nil)
	if e := p.Explain("acme", now); e.Next != "" || e.Reason != "no members" {
		t.Fatalf("no members: %+v", e)
	}
}
