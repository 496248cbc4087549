package tenantroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
)

// maxQueryValue bounds each query parameter of the placement query.
const maxQueryValue = 256

// PlacementView answers GET /tenant_route/placement: where a new connection
// of a tenant would go now, without making one.
type PlacementView struct {
	Handler          string          `json:"handler"`
	Tenant           string          `json:"tenant"`
	Partitions       int             `json:"partitions"`
	PartitionsSource string          `json:"partitions_source"`
	Members          int             `json:"members"`
	Nodes            []PlacementNode `json:"nodes"`
	NextNode         string          `json:"next_node"`
	Reason           string          `json:"reason"`
	OpenConnections  int             `json:"open_connections"`
}

// PlacementNode is one of the tenant's nodes, in rendezvous order.
type PlacementNode struct {
	Node            string `json:"node"`
	Rank            int    `json:"rank"`
	OpenConnections int64  `json:"open_connections"`
	CoolingOff      bool   `json:"cooling_off"`
	CoolOffUntil    string `json:"cool_off_until,omitempty"`
}

// placementQuery reads and checks handler and tenant: each exactly once,
// non-empty, at most maxQueryValue bytes of printable UTF-8, nothing else.
func placementQuery(r *http.Request) (handler, tenant string, err error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", "", fmt.Errorf("query: %v", err)
	}
	for key := range q {
		if key != "handler" && key != "tenant" {
			return "", "", fmt.Errorf("unknown query parameter %q: want handler and tenant", clip(key))
		}
	}
	get := func(key string) (string, error) {
		switch vs := q[key]; {
		case len(vs) == 0 || vs[0] == "":
			return "", fmt.Errorf("query parameter %s is required", key)
		case len(vs) > 1:
			return "", fmt.Errorf("query parameter %s is given %d times: give it once", key, len(vs))
		case len(vs[0]) > maxQueryValue:
			return "", fmt.Errorf("query parameter %s is %d bytes long: at most %d", key, len(vs[0]), maxQueryValue)
		case !utf8.ValidString(vs[0]):
			return "", fmt.Errorf("query parameter %s is not UTF-8", key)
		default:
			for _, c := range vs[0] {
				if !unicode.IsPrint(c) {
					return "", fmt.Errorf("query parameter %s holds a control character", key)
				}
			}
			return vs[0], nil
		}
	}
	if handler, err = get("handler"); err != nil {
		return "", "", err
	}
	tenant, err = get("tenant")
	return handler, tenant, err
}

// clip shortens a client-controlled string for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func servePlacement(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s: want GET", r.Method)}
	}
	handler, tenant, err := placementQuery(r)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	for _, s := range liveStates() {
		if s.name != handler {
			continue
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(explain(s, tenant, time.Now()))
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tenant_route handler named %q", handler)}
}

// explain is the placement query's answer for one handler's state.
func explain(s *state, tenant string, now time.Time) PlacementView {
	e := s.placer.Explain(tenant, now)
	v := PlacementView{Handler: s.name, Tenant: tenant, Partitions: e.Partitions, PartitionsSource: e.Source,
		Members: e.Members, Nodes: []PlacementNode{}, NextNode: e.Next, Reason: e.Reason,
		OpenConnections: s.connected.get(tenant)}
	for _, n := range e.Nodes {
		pn := PlacementNode{Node: n.Node, Rank: n.Rank, OpenConnections: n.OpenConnections, CoolingOff: !n.CoolOffUntil.IsZero()}
		if pn.CoolingOff {
			pn.CoolOffUntil = n.CoolOffUntil.UTC().Format(time.RFC3339)
		}
		v.Nodes = append(v.Nodes, pn)
	}
	return v
}
