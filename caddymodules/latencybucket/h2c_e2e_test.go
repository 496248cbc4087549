package latencybucket_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// grpcPublisher runs a grpc-go server (h2c only: it does not answer
// HTTP/1.1) with the standard health service; every answer carries its
// name in the x-publisher header.
func grpcPublisher(t *testing.T, name string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-publisher", name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // "" is SERVING
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// A pool of grpc-go publishers behind reverse_proxy (h2c upstreams): with
// `probe h2c` the policy measures them and 8 concurrent gRPC clients' calls
// through bin/caddy all succeed, each client pinned to one publisher; with
// `probe http` (HTTP/1.1, which grpc-go does not speak) the same
// publishers are never measured, their last_error says why.
func TestH2CProbeOfGRPCPublishers(t *testing.T) {
	pubs := []string{grpcPublisher(t, "publisher-1"), grpcPublisher(t, "publisher-2")}
	front, front2 := e2e.Addr(t), e2e.Addr(t)
	site := func(front, name, probe string) string {
		return fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	reverse_proxy h2c://%s h2c://%s {
		lb_policy latency_bucket {
			name %s
			probe %s /
			probe_interval 200ms
			sticky_user {http.request.header.x-user}
		}
	}
}
`, front, pubs[0], pubs[1], name, probe)
	}
	c := e2e.StartCaddy(t, "caddyfile", "{\n\tservers {\n\t\tprotocols h1 h2c\n\t}\n}\n"+
		site(front, "grpc-h2c", "h2c")+site(front2, "grpc-http", "http"))
	c.WaitTCP(t, front)
	c.WaitTCP(t, front2)
	waitView(t, c, "grpc-h2c", "measured both gRPC publishers", allMeasured(2))
	waitView(t, c, "grpc-http", "failed rounds on both", func(v latencybucket.PolicyView) bool {
		n := 0
		for _, p := range v.Publishers {
			if !p.Measured && !p.Active && p.Rounds >= 2 && p.LastError != "" {
				n++
			}
		}
		return n == 2
	})

	conn, err := grpc.NewClient("passthrough:///"+front, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	var mu sync.Mutex
	by := map[string]map[string]int{} // user → publisher → calls
	errs := make(chan error, 8*25)
	e2e.Together(8, func(u int) {
		user := fmt.Sprint("user-", u)
		for range 25 {
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-user", user), 10*time.Second)
			var hdr metadata.MD
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
			cancel()
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				errs <- fmt.Errorf("%s: %v %v", user, resp, err)
				continue
			}
			mu.Lock()
			if by[user] == nil {
				by[user] = map[string]int{}
			}
			name := "?"
			if p := hdr.Get("x-publisher"); len(p) == 1 {
				name = p[0]
			}
			by[user][name]++
			mu.Unlock()
		}
	})
	close(errs)
	for err := range errs {
		t.Errorf("gRPC call through bin/caddy failed: %v", err)
	}
	seen := map[string]bool{}
	for user, per := range by {
		if len(per) != 1 {
			t.Errorf("%s's calls went to %v: want one publisher (sticky)", user, per)
		}
		for p := range per {
			seen[p] = true
		}
	}
	if v := view(t, c, "grpc-h2c"); v.StickyEntries != 8 {
		t.Errorf("%d pins, want 8 (one per user): %v", v.StickyEntries, by)
	}
	t.Logf("users per publisher: %v", seen)
}
