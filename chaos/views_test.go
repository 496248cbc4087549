package chaos_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The admin views' fields the checks read, as the modules' READMEs
// document them.

type rlCluster struct {
	LastAttempt      string `json:"last_attempt"` // omitted before the first sync ended: starting
	RedisHealthy     bool   `json:"redis_healthy"`
	Fallback         bool   `json:"fallback"`
	FallbackPeers    int    `json:"fallback_peers"`
	SyncErrors       uint64 `json:"sync_errors_total"`
	LastErrorReason  string `json:"last_error_reason"`
	ReplicasSeen     int    `json:"replicas_seen"`
	ReplicasReserved int    `json:"replicas_reserved"`
	Reserving        bool   `json:"reserving"`
}

type lbStore struct {
	Healthy       bool   `json:"healthy"`
	Refusing      bool   `json:"refusing"`
	LastReason    string `json:"last_reason"`
	RefusedReason string `json:"refused_reason"`
}

type ogsServer struct {
	RedisHealthy  *bool `json:"redis_healthy"`
	RedisTroubles []struct {
		Keys   string    `json:"keys"`
		Reason string    `json:"reason"`
		Since  time.Time `json:"since"`
	} `json:"redis_troubles"`
	Locations []struct {
		Location string   `json:"location"`
		Order    []string `json:"order"`
	} `json:"locations"`
	RunsTotal int `json:"runs_total"`
}

// rlView is the replica's cluster view of profile p (nil: no answer).
func (r *replica) rlView() *rlCluster {
	var v []struct {
		Name     string `json:"name"`
		Profiles []struct {
			Name    string     `json:"name"`
			Cluster *rlCluster `json:"cluster"`
		} `json:"profiles"`
	}
	if getJSON("http://"+r.adminAddr()+"/peer_rate_limit/", &v) != nil {
		return nil
	}
	for _, h := range v {
		for _, p := range h.Profiles {
			if h.Name == "edge" && p.Name == "p" {
				return p.Cluster
			}
		}
	}
	return nil
}

// lbView is the replica's sticky store view of policy apps.
func (r *replica) lbView() *lbStore {
	var v []struct {
		Name        string   `json:"name"`
		StickyStore *lbStore `json:"sticky_store"`
	}
	if getJSON("http://"+r.adminAddr()+"/latency_bucket/", &v) != nil {
		return nil
	}
	for _, p := range v {
		if p.Name == "apps" {
			return p.StickyStore
		}
	}
	return nil
}

func (r *replica) ogsView() *ogsServer {
	var v struct {
		Servers []ogsServer `json:"servers"`
	}
	if getJSON("http://"+r.admin+"/ogs", &v) != nil || len(v.Servers) != 1 {
		return nil
	}
	return &v.Servers[0]
}

// storeErrors adds up coredns_ogs_store_errors_total over its labels (-1:
// no answer).
func (r *replica) storeErrors() float64 {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "coredns_ogs_store_errors_total{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += v
		}
	}
	return n
}
