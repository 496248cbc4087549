package e2e

import "sync"

// Together runs f(0) … f(n-1), each on a goroutine of its own, all
// released at once after the last is started, and returns when every one
// has returned: a burst of simultaneous arrivals, as clients reconnecting
// after an outage make.
func Together(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(i)
		}()
	}
	close(start)
	wg.Wait()
}
