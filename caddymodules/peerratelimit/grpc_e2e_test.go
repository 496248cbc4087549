package peerratelimit_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// startGRPCHealth starts a gRPC server (plaintext HTTP/2) serving the
// standard health service, and returns its address.
func startGRPCHealth(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// healthCheck makes one call through addr with a real gRPC client and
// returns its status.
func healthCheck(t *testing.T, cc *grpc.ClientConn) *status.Status {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return status.Convert(err)
}

// A gRPC call refused by peer_rate_limit reaches a real gRPC client (over
// h2c through bin/caddy) as RESOURCE_EXHAUSTED with the message — not the
// UNAVAILABLE a client makes of HTTP 429 — at ingress and from the egress
// transport; a dropped call (the stream reset) is INTERNAL.
func TestGRPCRefusalIsResourceExhausted(t *testing.T) {
	upstream := startGRPCHealth(t)
	ingress, drop, egress := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	servers {
		protocols h1 h2c
	}
}
http://%[1]s {
	bind 127.0.0.1
	peer_rate_limit {
		profile all {
			rate 0.01 1
			action reject 429 "slow down"
		}
	}
	reverse_proxy h2c://%[4]s
}
http://%[2]s {
	bind 127.0.0.1
	peer_rate_limit {
		profile all {
			rate 0.01 1
			action drop
		}
	}
	reverse_proxy h2c://%[4]s
}
http://%[3]s {
	bind 127.0.0.1
	reverse_proxy h2c://%[4]s {
		transport peer_rate_limit {
			group backend %[4]s {
				rate 0.01 1
				action reject 503 "backend busy: 100%% used"
			}
			transport http {
				versions h2c
			}
		}
	}
}`, ingress, drop, egress, upstream))
	for name, addr := range map[string]string{"ingress": ingress, "drop": drop, "egress": egress} {
		c.WaitTCP(t, addr)
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if st := healthCheck(t, cc); st.Code() != codes.OK {
			t.Fatalf("%s: first call %v, want OK", name, st)
		}
		st := healthCheck(t, cc)
		want, msg := codes.ResourceExhausted, "slow down"
		switch name {
		case "drop":
			want, msg = codes.Internal, st.Message()
		case "egress":
			msg = "backend busy: 100% used"
		}
		if st.Code() != want || st.Message() != msg {
			t.Errorf("%s: second call %v (%q), want %v (%q)", name, st.Code(), st.Message(), want, msg)
		}
	}
}
