package tenantroute_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

const sizesPrefix = "/edgesteer/ldap/sizes/"

// spread opens n connections of tenant one after another through front
// and returns the connections each node answered; least connections puts
// each on the emptiest of the tenant's nodes, so with nodes evenly loaded
// before, n a multiple of k reaches exactly the tenant's k nodes. The
// connections are closed, and the router seen to count them no more,
// before it returns.
func spread(t *testing.T, c *e2e.Caddy, front, tenant string, n int) map[string]int {
	t.Helper()
	before := adminView(t, c).Tenants[tenant].Connections
	per, conns := hold(t, front, tenant, n)
	for _, conn := range conns {
		conn.Close()
	}
	waitView(t, c, tenant+"'s connections closed", func(v viewT) bool { return v.Tenants[tenant].Connections == before })
	return per
}

func placementOf(t *testing.T, c *e2e.Caddy, tenant string) (k int, source string) {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/tenant_route/placement?" +
		url.Values{"handler": {"ldap"}, "tenant": {tenant}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Partitions int    `json:"partitions"`
		Source     string `json:"partitions_source"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	return e.Partitions, e.Source
}

// Partitions from a tenant's size, through the sizes example over four
// slapd nodes: a large tenant's connections reach four nodes, a small
// one's one, an unlisted one's the default two; a malformed line is
// skipped and counted; rewriting the file changes the counts live (new
// connections follow, held ones stay); a reload keeps the sizes read and
// applies its new table to them.
func TestPartitionsFromTenantSize(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 4, ldif)
	front := e2e.Addr(t)
	sizes := filepath.Join(t.TempDir(), "sizes.txt")
	write := func(content string) {
		// Written aside and renamed, as an operator's tool should: the
		// router never reads half a file.
		if err := os.WriteFile(sizes+".new", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(sizes+".new", sizes); err != nil {
			t.Fatal(err)
		}
	}
	write("globex 25000\ninitech 40\numbrella lots\n")
	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "ldap-tenant-routing-sizes.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	config := func(table string) string {
		return strings.NewReplacer("127.0.0.1:3389", front, "127.0.0.1:3891", addrs[0], "127.0.0.1:3892", addrs[1],
			"127.0.0.1:3893", addrs[2], "127.0.0.1:3894", addrs[3], "Caddyfile.examples/tenant-sizes.txt", sizes,
			"0:1 1000:2 10000:4", table).Replace(string(example))
	}
	c := e2e.StartCaddy(t, "caddyfile", config("0:1 1000:2 10000:4"))
	c.WaitTCP(t, front)

	for tenant, want := range map[string]int{"globex": 4, "initech": 1, "acme": 2, "umbrella": 2} {
		if got := spread(t, c, front, tenant, 8); len(got) != want {
			t.Errorf("%s: 8 connections reached %d nodes (%v), want %d", tenant, len(got), got, want)
		}
	}
	if k, src := placementOf(t, c, "globex"); k != 4 || src != "size" {
		t.Errorf("placement of globex: %d from %q, want 4 from size", k, src)
	}
	if s := adminView(t, c).TenantSizes; s == nil || s.Tenants != 2 || s.Rejected != 1 || len(s.Problems) != 1 {
		t.Errorf("tenant_sizes view %+v: want 2 tenants, 1 rejected (umbrella lots)", s)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Live: initech grows to 10 000 users, globex shrinks to 5. Held
	// connections stay where they are; new ones follow the new counts.
	held := wave(t, front, "globex", 4)
	write("globex 5\ninitech 10000\n")
	waitView(t, c, "the rewritten sizes", func(v viewT) bool {
		k, _ := placementOf(t, c, "initech")
		return k == 4 && v.Tenants["globex"].Partitions == 1
	})
	if got := spread(t, c, front, "initech", 8); len(got) != 4 {
		t.Errorf("initech after growing to 10000 users: new connections on %d nodes (%v), want 4", len(got), got)
	}
	if got := spread(t, c, front, "globex", 4); len(got) != 1 {
		t.Errorf("globex after shrinking to 5 users: new connections on %d nodes (%v), want 1", len(got), got)
	}
	stillThere(t, "after the sizes changed", held)

	// A reload keeps the sizes read (process state) and applies its table.
	c.Reload(t, "caddyfile", config("0:1 1000:3"))
	waitView(t, c, "the reloaded table", func(v viewT) bool { return v.Tenants["globex"].Partitions == 1 })
	if k, src := placementOf(t, c, "initech"); k != 3 || src != "size" {
		t.Errorf("placement of initech after the reload: %d from %q, want 3 from size", k, src)
	}
	stillThere(t, "after the reload", held)
}

// etcdSizes continues TestGrownPartitionsPublished (etcd, four slapd nodes
// registered, assignments published): a reload reads tenant sizes from
// etcd; a large tenant's connections reach four nodes and a small one's
// one, each published as its assignment; a size put in etcd changes a
// tenant's nodes live, and a malformed value is rejected and counted.
func etcdSizes(t *testing.T, c *e2e.Caddy, reg *registry, front string, addrs []string, config func(string) string) {
	put := func(tenant, size string) {
		if _, err := reg.cli.Put(context.Background(), sizesPrefix+tenant, size); err != nil {
			t.Fatal(err)
		}
	}
	put("globex", "25000")
	put("initech", "40")
	put("umbrella", "-1")
	c.Reload(t, "caddyfile", strings.Replace(config("sizes_prefix "+sizesPrefix), "partitions 2",
		"partitions 2\n\t\t\t\t\tpartitions_by_size 0:1 1000:2 10000:4", 1))
	waitView(t, c, "the sizes from etcd", func(v viewT) bool { return v.TenantSizes != nil && v.TenantSizes.Tenants == 2 })
	if s := adminView(t, c).TenantSizes; s.Rejected != 1 {
		t.Errorf("tenant_sizes %+v: want umbrella's -1 rejected", s)
	}
	waitAssignment := func(tenant string, k int) {
		t.Helper()
		want := placement.Rank(tenant, addrs)[:k]
		deadline := time.Now().Add(15 * time.Second)
		for !slices.Equal(reg.assignments()[tenant], want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's assignment %v, want %v", tenant, reg.assignments()[tenant], want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitAssignment("globex", 4)
	waitAssignment("initech", 1)
	// 4 of initech's: below target_per_node 5 at k = 1, so auto does not
	// grow it from its base.
	for tenant, n := range map[string]int{"globex": 8, "initech": 4} {
		want := map[string]int{"globex": 4, "initech": 1}[tenant]
		if got := spread(t, c, front, tenant, n); len(got) != want {
			t.Errorf("%s: %d connections reached %d nodes (%v), want %d", tenant, n, len(got), got, want)
		}
	}
	put("initech", "10000")
	waitAssignment("initech", 4)
	if k, src := placementOf(t, c, "initech"); k != 4 || src != "size" {
		t.Errorf("initech after its size was put: %d from %q, want 4 from size", k, src)
	}
}
