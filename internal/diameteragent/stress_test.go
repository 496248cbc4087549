package diameteragent

import (
	"fmt"
	"sync"
	"testing"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// Concurrent bursts from four pGWs over Gx and Gy while a PCRF is killed
// in the middle: every request gets exactly one answer, a success (no
// request is lost: the dead PCRF's pending ones fail over), all of a
// session's requests that succeed reach one server, and nothing stays
// pending.
func TestConcurrentBurstsWithServerKilled(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[0].Policy = LeastOutstanding
	h := newHarness(t, cfg)
	h.start()
	const perClient, sessions = 400, 20
	var clients []*client
	for i := range 4 {
		clients = append(clients, h.connect(fmt.Sprintf("pgw%d.example", i+1)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(clients))
	for ci, c := range clients {
		wg.Add(2)
		go func() { // sender
			defer wg.Done()
			for i := range perClient {
				app, realm := uint32(diameter.AppGx), "pcrf.example"
				if i%2 == 1 {
					app, realm = diameter.AppGy, "ocs.example"
				}
				typ := uint32(2)
				if i < 2*sessions {
					typ = 1
				}
				c.send(req{app: app, realm: realm, ccType: typ, session: fmt.Sprintf("%s;%d;%d", c.host, app, i%sessions),
					origin: c.host, e2e: uint32(i + 1)}.bytes(t))
			}
		}()
		go func() { // receiver
			defer wg.Done()
			seen := map[uint32]bool{}
			for range perClient {
				a := c.next()
				if a.result != ResultSuccess || seen[a.e2e] {
					errs <- fmt.Errorf("pgw%d: answer %d to e2e %d (seen before: %v) from %s %q", ci+1, a.result, a.e2e, seen[a.e2e], a.origin, a.errMsg)
					return
				}
				seen[a.e2e] = true
			}
		}()
	}
	eventually(t, "traffic on pcrf1", func() bool { return len(h.srv["pcrf1.example"].requests()) > 100 })
	h.srv["pcrf1.example"].conn.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, gr := range h.agent.gen.Load().groups {
		if n := gr.st.pending.Load(); n != 0 {
			t.Errorf("group %s: %d still pending", gr.Name, n)
		}
	}
	// A session's requests that were answered by one OCS all went there.
	where := map[string]string{}
	for _, host := range []string{"ocs1.example", "ocs2.example"} {
		for _, m := range h.srv[host].requests() {
			if prev, ok := where[m.session]; ok && prev != host {
				t.Fatalf("session %s at %s and %s", m.session, prev, host)
			}
			where[m.session] = host
		}
	}
}
