package main

import (
	"slices"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
)

func TestWithEdgesteerInsertsBeforeAnchor(t *testing.T) {
	stock := []string{"log", "acl", "cache", "forward"}
	got, err := withEdgesteer(stock, []directive{{Name: "ogs", Before: "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"log", "acl", "ogs", "cache", "forward"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if !slices.Equal(stock, []string{"log", "acl", "cache", "forward"}) {
		t.Fatalf("stock list was modified: %v", stock)
	}
}

func TestWithEdgesteerRejectsBadPlacement(t *testing.T) {
	if _, err := withEdgesteer([]string{"cache"}, []directive{{Name: "x", Before: "nope"}}); err == nil {
		t.Fatal("want an error for a missing anchor")
	}
	if _, err := withEdgesteer([]string{"cache"}, []directive{{Name: "cache", Before: "cache"}}); err == nil {
		t.Fatal("want an error for a duplicate name")
	}
}

// The real plugin list must fit the real CoreDNS directive list.
func TestEdgesteerPluginsFitStockDirectives(t *testing.T) {
	got, err := withEdgesteer(dnsserver.Directives, edgesteerPlugins)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(dnsserver.Directives)+len(edgesteerPlugins) {
		t.Fatalf("directive count %d, want %d", len(got), len(dnsserver.Directives)+len(edgesteerPlugins))
	}
	for _, p := range edgesteerPlugins {
		if i, j := slices.Index(got, p.Name), slices.Index(got, p.Before); i < 0 || i+1 > j {
			t.Errorf("%s at %d is not before %s at %d", p.Name, i, p.Before, j)
		}
	}
}
