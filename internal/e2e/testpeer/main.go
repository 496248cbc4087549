// Command testpeer is a real peer process for end-to-end tests.
//
//	testpeer -listen 127.0.0.1:9001 -name publisher-1 -probe-delay 42ms
//
// It serves HTTP: GET /probe answers after -probe-delay (a real delay in the
// probe exchange, standing in for network distance); every other request is
// answered after -delay with the peer's name in the body and in X-Peer.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	name := flag.String("name", "peer", "name to answer with")
	probeDelay := flag.Duration("probe-delay", 0, "delay before answering GET /probe")
	delay := flag.Duration("delay", 0, "delay before answering any other request")
	flag.Parse()

	mux := http.NewServeMux()
	mux.HandleFunc("/probe", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*probeDelay)
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*delay)
		w.Header().Set("X-Peer", *name)
		fmt.Fprintf(w, "%s %s %s\n", *name, r.Method, r.URL.Path)
	})
	log.Printf("testpeer %s listening on %s (probe delay %v)", *name, *listen, *probeDelay)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
