package e2e

import "syscall"

// dieWithParent makes a started program get SIGKILL when the test process
// dies, so a crashed test leaves no server behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
