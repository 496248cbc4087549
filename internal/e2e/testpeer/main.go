// Command testpeer is a real peer process for end-to-end tests.
//
//	testpeer -listen 127.0.0.1:9001 -name publisher-1 -probe-delay 42ms
//
// It serves HTTP: GET /probe answers after -probe-delay (a real delay in the
// probe exchange, standing in for network distance); every other request is
// answered after -delay with the peer's name in the body and in X-Peer.
// With -slots N at most N such requests are in service at once and the rest
// wait in arrival order; -cpu burns that much CPU per request (capacity.go).
//
// With -diameter it is also a Diameter server (a PCRF or an OCS, see
// diameter.go) named -name in realm -realm, whose counts GET /_diameter
// shows.
//
// As an origin it records what it saw of each request (remote address,
// Client-IP, X-Forwarded-For; the last 10,000) at GET /_seen, and
// -cache-control sets that header on answers so a cache may keep them.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"sync"
	"time"
)

// seen is what the peer saw of one request.
type seen struct {
	Remote   string `json:"remote"`
	Path     string `json:"path"`
	ClientIP string `json:"client_ip"`
	XFF      string `json:"xff"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	name := flag.String("name", "peer", "name to answer with")
	probeDelay := flag.Duration("probe-delay", 0, "delay before answering GET /probe")
	delay := flag.Duration("delay", 0, "delay before answering any other request")
	cacheControl := flag.String("cache-control", "", "Cache-Control header on answers")
	status := flag.Int("status", http.StatusOK, "status of answers to other requests")
	diameterAddr := flag.String("diameter", "", "also serve Diameter on this address")
	realm := flag.String("realm", "example", "Diameter realm (with -diameter)")
	answerDelay := flag.Duration("answer-delay", 0, "delay before answering a Diameter request (with -diameter)")
	slots := flag.Int("slots", 0, "at most this many requests in service at once, the rest queued (0: no limit)")
	cpu := flag.Duration("cpu", 0, "CPU time to burn per request, inside its slot")
	flag.Parse()
	if *diameterAddr != "" {
		serveDiameter(*diameterAddr, *name, *realm, *answerDelay)
	}

	var mu sync.Mutex
	var requests []seen
	work := newCapacity(*slots, *delay, *cpu)

	mux := http.DefaultServeMux
	mux.HandleFunc("/probe", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*probeDelay)
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /_seen", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		json.NewEncoder(w).Encode(requests)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if len(requests) >= 10000 {
			requests = requests[1:]
		}
		requests = append(requests, seen{r.RemoteAddr, r.URL.Path, r.Header.Get("Client-IP"), r.Header.Get("X-Forwarded-For")})
		mu.Unlock()
		if !work.serve(r.Context()) {
			return // its client went away while it waited for a slot
		}
		w.Header().Set("X-Peer", *name)
		if *cacheControl != "" {
			w.Header().Set("Cache-Control", *cacheControl)
		}
		w.WriteHeader(*status)
		fmt.Fprintf(w, "%s %s %s\n", *name, r.Method, r.URL.Path)
	})
	log.Printf("testpeer %s listening on %s (probe delay %v)", *name, *listen, *probeDelay)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
