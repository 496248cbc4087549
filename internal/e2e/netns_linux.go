package e2e

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs f on a locked thread switched into host's network namespace (a
// socket stays in the namespace it was made in: a listener made in f
// listens there).
func (tp *Topology) In(host string, f func() error) error {
	target, err := os.Open("/var/run/netns/" + tp.NS(host))
	if err != nil {
		return err
	}
	defer target.Close()
	runtime.LockOSThread()
	own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer own.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the wrong namespace: leave it locked, so it
		// ends with this goroutine instead of serving others.
		return fmt.Errorf("returning from namespace %s: %v", tp.NS(host), err)
	}
	runtime.UnlockOSThread()
	return ferr
}
