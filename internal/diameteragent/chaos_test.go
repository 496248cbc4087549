package diameteragent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// Traffic from four pGWs while servers die, hang and come back and the
// clock runs through watchdog periods and request timeouts: every request
// gets exactly one answer (2001, or the agent's 3002 or 3004), and in the
// end nothing is pending anywhere.
func TestChaosEveryRequestAnsweredOnce(t *testing.T) {
	cfg := baseConfig()
	cfg.Watchdog = 6 * time.Second
	cfg.Groups[0].RequestTimeout = 20 * time.Second // failovers happen before timeouts
	h := newHarness(t, cfg)
	h.start()
	const perClient = 300
	var clients []*client
	for i := range 4 {
		clients = append(clients, h.connect(fmt.Sprintf("pgw%d.example", i+1)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for _, c := range clients {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range perClient {
				app, realm := uint32(diameter.AppGx), "pcrf.example"
				if i%3 == 0 {
					app, realm = diameter.AppGy, "ocs.example"
				}
				c.send(req{app: app, realm: realm, ccType: uint32(1 + i%3), session: fmt.Sprintf("%s;%d", c.host, i%25),
					origin: c.host, e2e: uint32(i + 1)}.bytes(t))
				if i%50 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
		go func() {
			defer wg.Done()
			seen := map[uint32]bool{}
			for range perClient {
				a := c.next()
				ok := a.result == ResultSuccess || (a.origin == "dra.example" && (a.result == ResultUnableToDeliver || a.result == ResultTooBusy))
				if !ok || seen[a.e2e] {
					errs <- fmt.Errorf("%s: answer %d from %s to e2e %d (again: %v)", c.host, a.result, a.origin, a.e2e, seen[a.e2e])
					return
				}
				seen[a.e2e] = true
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// The chaos, while traffic flows.
	eventually(t, "traffic", func() bool { return len(h.srv["pcrf1.example"].requests()) > 20 })
	h.srv["pcrf1.example"].conn.Close()  // killed; reconnects on the next backoff
	h.srv["ocs1.example"].setMute(true)  // hangs: SUSPECT, then DOWN
	h.srv["pcrf2.example"].setHold(true) // slow
	for range 6 {
		h.clock.Advance(3 * time.Second)
		time.Sleep(5 * time.Millisecond)
	}
	h.srv["ocs1.example"].setMute(false)
	h.srv["pcrf2.example"].release()
	// Let every request still pending reach its timeout.
	for {
		select {
		case <-done:
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			v := h.agent.View()
			t.Logf("groups %+v counts %+v", v.Groups, v.Counts)
			for _, gr := range h.agent.gen.Load().groups {
				if n := gr.st.pending.Load(); n != 0 {
					t.Errorf("group %s: %d pending at the end", gr.Name, n)
				}
			}
			return
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(20 * time.Millisecond):
			h.srv["pcrf2.example"].release()
			h.clock.Advance(time.Second)
		}
	}
}
