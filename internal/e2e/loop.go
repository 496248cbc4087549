package e2e

import "sync"

// Loop runs f(i) over and over in n goroutines (i = 0…n−1), as load beside
// a test's steps, until stop is called or that goroutine's f returns
// false. stop ends every loop, waits for the calls in progress and may be
// called more than once.
func Loop(n int, f func(i int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if !f(i) {
					return
				}
			}
		}()
	}
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}
