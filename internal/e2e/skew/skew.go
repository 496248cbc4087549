// Package skew runs a program whose wall clock is ahead of or behind the
// machine's by a fixed offset, while its monotonic clock is left alone: the
// fault "one replica's clock is wrong" for the real, unmodified binaries
// (bin/caddy, bin/coredns), which a clock passed as a parameter cannot
// reach.
//
// The command internal/e2e/skew/cmd/skewclock is the launcher:
//
//	skewclock -offset 800ms -- bin/caddy run --config caddy.json
//	ip netns exec NS skewclock -offset -1.5s -- bin/coredns -conf Corefile
//
// # How
//
// A Go program reads the wall clock through the vDSO, in user space, so no
// system call happens that a tool could change (faketime and other
// LD_PRELOAD tricks reach libc only, which Go does not call). skewclock
// therefore takes two steps:
//
//  1. It hides the vDSO. It starts the target traced (PTRACE_TRACEME), lets
//     a copy of itself install a seccomp filter and exec the target, and at
//     the exec stop, before the target's first instruction, rewrites the
//     AT_SYSINFO_EHDR entry of the new image's auxiliary vector on its stack
//     to AT_IGNORE. The Go runtime (and glibc) then finds no vDSO and reads
//     every clock with the clock_gettime system call. Then it detaches.
//  2. It answers the wall-clock reads. The seccomp filter sends only
//     clock_gettime(CLOCK_REALTIME), clock_gettime(CLOCK_REALTIME_COARSE),
//     gettimeofday and time to a user-space notifier (SECCOMP_RET_USER_NOTIF)
//     held by the launcher, which writes real time + offset into the
//     caller's memory and completes the call. Every other system call,
//     CLOCK_MONOTONIC and CLOCK_BOOTTIME included, runs in the kernel
//     untouched.
//
// Why a seccomp notifier rather than tracing the whole run: once the target
// runs, it is not traced. Its signals (Go's preemption signals, SIGTERM,
// SIGSTOP/SIGCONT pauses) reach it directly with their ordinary meaning,
// no other system call ever stops, and strace or a debugger can still
// attach. ptrace is used only for the moment between exec and the first
// instruction, which nothing else can reach.
//
// The launcher forwards SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
// SIGALRM, SIGWINCH and SIGCONT to the target, exits with the target's exit
// code, or, when the target is killed by a signal, dies of that same
// signal, so its parent sees what it would have seen of the target. If the
// launcher dies, the target gets SIGKILL (PR_SET_PDEATHSIG): a target whose
// notifier is gone would read a garbage wall clock. SIGSTOP cannot be
// forwarded; pause the target itself (TargetPID).
//
// Only linux/amd64 is supported; elsewhere the launcher says so and exits 125.
package skew

import (
	"os/exec"
	"time"
)

// ExitFailure is the launcher's exit code when it fails itself (bad
// arguments excepted, which exit 2); 126 and 127 mean, as in a shell, that
// the target could not be executed or was not found.
const ExitFailure = 125

// Args returns the launcher's arguments that run bin with args under a
// wall-clock offset: e2e.Start(t, name, skewclockPath, env, skew.Args(...)...).
func Args(offset time.Duration, bin string, args ...string) []string {
	return append([]string{"-offset", offset.String(), "--", bin}, args...)
}

// Command returns an unstarted command that runs bin with args under the
// launcher at path launcher (a build of cmd/skewclock), offset off the
// machine's wall clock.
func Command(launcher string, offset time.Duration, bin string, args ...string) *exec.Cmd {
	return exec.Command(launcher, Args(offset, bin, args...)...)
}
