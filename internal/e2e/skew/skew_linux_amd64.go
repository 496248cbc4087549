//go:build linux && amd64

package skew

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// stageEnv marks the launcher's own child: the copy of skewclock that
// installs the filter and execs the target. It never reaches the target.
const stageEnv = "EDGESTEER_SKEWCLOCK_STAGE"

// stageFD is the child's end of the socket that carries the notifier back.
const stageFD = 3

// Auxiliary vector entry types (elf.h).
const (
	atNull        = 0
	atIgnore      = 1
	atSysinfoEhdr = 33
)

// Main is the skewclock command. It must be called from the main
// goroutine locked to the main thread (runtime.LockOSThread in the
// command's init), and never returns.
func Main() {
	os.Exit(run(os.Args))
}

func run(args []string) int {
	if os.Getenv(stageEnv) != "" {
		return stage(args)
	}
	fs := flag.NewFlagSet("skewclock", flag.ContinueOnError)
	offset := fs.Duration("offset", 0, "how far the target's wall clock is ahead of the machine's (negative: behind), e.g. 800ms, -1.5s")
	verbose := fs.Bool("v", false, "say on stderr what was done: the vDSO hidden, the wall-clock reads answered")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: skewclock [-v] -offset DURATION -- PROGRAM [ARG...]\n\n"+
			"Runs PROGRAM with its wall clock (CLOCK_REALTIME, gettimeofday, time) off by DURATION;\n"+
			"its monotonic clock is untouched. Exits with PROGRAM's status.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fs.Usage()
		return 2
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "skewclock: %v\n", err)
		return 127
	}
	logf := func(string, ...any) {}
	if *verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "skewclock: "+f+"\n", a...) }
	}
	return launch(*offset, path, argv, logf)
}

// forwarded are the signals the launcher passes on to the target.
var forwarded = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGWINCH, syscall.SIGCONT}

// launch runs the target and returns the launcher's exit code; when the
// target dies of a signal, launch dies of it too.
func launch(offset time.Duration, path string, argv []string, logf func(string, ...any)) int {
	// ptrace requests must come from the thread that started the child,
	// and PR_SET_PDEATHSIG fires when that thread ends: hold it for good.
	runtime.LockOSThread()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "skewclock: %v\n", err)
		return ExitFailure
	}
	pid, mine, sigs, err := startStage(path, argv)
	if err != nil {
		return fail(err)
	}
	var served atomic.Int64
	notifier := answerClockReads(mine, offset, &served)

	status, done, err := startTarget(pid, logf)
	if err == nil && !done {
		err = awaitNotifier(notifier)
	}
	if err != nil {
		unix.Kill(pid, unix.SIGKILL)
		unix.Wait4(pid, nil, 0, nil)
		return fail(err)
	}
	if !done {
		logf("pid %d runs %s, wall clock %+v", pid, path, offset)
		if status, err = waitEnd(pid); err != nil {
			return fail(fmt.Errorf("wait: %w", err))
		}
	}
	signal.Stop(sigs)
	logf("%d wall-clock reads answered; target %s", served.Load(), describe(status))
	if status.Signaled() {
		dieOf(status.Signal())
	}
	return status.ExitStatus()
}

// startStage starts the stage process (this program again, traced, dying
// with the launcher) with one end of a socket pair, on which it sends the
// notifier, and forwards the launcher's signals to it. mine is the
// launcher's end.
func startStage(path string, argv []string) (pid, mine int, sigs chan os.Signal, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("socketpair: %w", err)
	}
	mine, theirs := fds[0], os.NewFile(uintptr(fds[1]), "skewclock-stage")

	sigs = make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)

	env := append(os.Environ(), stageEnv+"=1")
	proc, err := os.StartProcess("/proc/self/exe", append([]string{os.Args[0], path}, argv...), &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr, theirs},
		Sys:   &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL},
	})
	theirs.Close()
	if err != nil {
		return 0, 0, nil, err
	}
	go func() {
		for s := range sigs {
			proc.Signal(s)
		}
	}()
	return proc.Pid, mine, sigs, nil
}

// answerClockReads waits for the notifier from the stage process, which
// sends it before it execs the target, and answers the target's clock
// reads from then on, whatever the tracing is doing. The channel gets the
// error receiving it, or nil.
func answerClockReads(mine int, offset time.Duration, served *atomic.Int64) <-chan error {
	notifier := make(chan error, 1)
	go func() {
		fd, err := receiveFD(mine)
		unix.Close(mine)
		if err == nil {
			// The caller and the answer hand over on one CPU (6.6+).
			unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, syncWakeUp)
			for range max(2, runtime.NumCPU()) {
				go serve(fd, offset, served)
			}
		}
		notifier <- err
	}()
	return notifier
}

// awaitNotifier returns the notifier's error, or one if it has not come
// within 10 s.
func awaitNotifier(notifier <-chan error) error {
	select {
	case err := <-notifier:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("no notifier from the stage process")
	}
}

// waitEnd waits for the target's end.
func waitEnd(pid int) (status unix.WaitStatus, err error) {
	for {
		_, err = unix.Wait4(pid, &status, 0, nil)
		if err != unix.EINTR {
			return status, err
		}
	}
}

// startTarget follows the traced child from its first stop to the exec of
// the target, hides the target's vDSO there and detaches. done reports that
// the child ended before (status is then its end, say an exec error).
func startTarget(pid int, logf func(string, ...any)) (status unix.WaitStatus, done bool, err error) {
	if _, err := unix.Wait4(pid, &status, unix.WALL, nil); err != nil {
		return status, false, fmt.Errorf("wait for the stage process: %w", err)
	}
	if !status.Stopped() || status.StopSignal() != unix.SIGTRAP {
		return status, true, nil
	}
	if err := unix.PtraceSetOptions(pid, unix.PTRACE_O_TRACEEXEC|unix.PTRACE_O_EXITKILL); err != nil {
		return status, false, fmt.Errorf("ptrace options: %w", err)
	}
	sig := 0
	for {
		if err := unix.PtraceCont(pid, sig); err != nil {
			return status, false, fmt.Errorf("ptrace cont: %w", err)
		}
		if _, err := unix.Wait4(pid, &status, unix.WALL, nil); err != nil {
			return status, false, fmt.Errorf("wait for the stage process: %w", err)
		}
		if status.Exited() || status.Signaled() {
			return status, true, nil
		}
		if status.StopSignal() == unix.SIGTRAP && status.TrapCause() == unix.PTRACE_EVENT_EXEC {
			break
		}
		// A signal for the stage process: deliver it (a group stop, from
		// which nothing is to be delivered, is only resumed).
		sig = int(status.StopSignal())
		var si [128]byte
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETSIGINFO, uintptr(pid), 0,
			uintptr(unsafe.Pointer(&si[0])), 0, 0); e != 0 {
			sig = 0
		}
	}
	ehdr, err := hideVDSO(pid)
	if err != nil {
		return status, false, fmt.Errorf("hiding the vDSO of pid %d: %w", pid, err)
	}
	if ehdr != 0 {
		logf("vDSO at %#x hidden from pid %d", ehdr, pid)
	} else {
		logf("pid %d has no vDSO", pid)
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return status, false, fmt.Errorf("ptrace detach: %w", err)
	}
	return status, false, nil
}

// hideVDSO turns the AT_SYSINFO_EHDR entry of a process stopped right after
// exec into AT_IGNORE, on its initial stack (rsp → argc, argv…, NULL,
// envp…, NULL, auxv pairs until AT_NULL), after checking that what it found
// there is the vector the kernel handed over (/proc/PID/auxv). It returns
// the vDSO's address, 0 when there was none.
func hideVDSO(pid int) (uint64, error) {
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return 0, fmt.Errorf("registers: %w", err)
	}
	saved, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid))
	if err != nil {
		return 0, err
	}
	peek := func(addr uint64) (uint64, error) {
		var b [8]byte
		if _, err := unix.PtracePeekData(pid, uintptr(addr), b[:]); err != nil {
			return 0, fmt.Errorf("reading %#x: %w", addr, err)
		}
		return *(*uint64)(unsafe.Pointer(&b[0])), nil
	}
	sp := regs.Rsp
	argc, err := peek(sp)
	if err != nil {
		return 0, err
	}
	if argc > 1<<20 {
		return 0, fmt.Errorf("argc %d at %#x: not an initial stack", argc, sp)
	}
	addr := sp + 8 + (argc+1)*8 // past argc, argv and its NULL
	for n := 0; ; n++ {
		if n > 1<<20 {
			return 0, errors.New("no end of the environment")
		}
		w, err := peek(addr)
		if err != nil {
			return 0, err
		}
		addr += 8
		if w == 0 {
			break
		}
	}
	auxv := addr
	var ehdr, at uint64
	for i := 0; ; i += 16 {
		if i+16 > len(saved) {
			return 0, errors.New("the stack's auxiliary vector is longer than /proc/PID/auxv")
		}
		typ, err := peek(auxv + uint64(i))
		if err != nil {
			return 0, err
		}
		val, err := peek(auxv + uint64(i) + 8)
		if err != nil {
			return 0, err
		}
		wantTyp := *(*uint64)(unsafe.Pointer(&saved[i]))
		wantVal := *(*uint64)(unsafe.Pointer(&saved[i+8]))
		if typ != wantTyp || val != wantVal {
			return 0, fmt.Errorf("auxiliary vector entry %d on the stack is (%d, %#x), /proc/PID/auxv says (%d, %#x)",
				i/16, typ, val, wantTyp, wantVal)
		}
		if typ == atSysinfoEhdr {
			ehdr, at = val, auxv+uint64(i)
		}
		if typ == atNull {
			break
		}
	}
	if ehdr == 0 {
		return 0, nil
	}
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = atIgnore
	if _, err := unix.PtracePokeData(pid, uintptr(at), b[:]); err != nil {
		return 0, fmt.Errorf("writing %#x: %w", at, err)
	}
	if w, err := peek(at); err != nil || w != atIgnore {
		return 0, fmt.Errorf("AT_SYSINFO_EHDR at %#x still %d after the write (%v)", at, w, err)
	}
	return ehdr, nil
}

// receiveFD reads one descriptor passed with SCM_RIGHTS over sock.
func receiveFD(sock int) (int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("receiving the notifier: %w", err)
		}
		if n == 0 && oobn == 0 {
			return -1, errors.New("the stage process ended before it sent the notifier")
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return -1, fmt.Errorf("notifier message: %v", err)
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			return -1, fmt.Errorf("notifier message: %v", err)
		}
		return fds[0], nil
	}
}

// stage is the launcher's child, traced, on the main thread: it installs
// the filter, sends the notifier to the launcher and execs the target
// (args: argv0, path, target argv...). Its exec is where the launcher
// hides the vDSO.
func stage(args []string) int {
	fail := func(code int, f string, a ...any) int {
		fmt.Fprintf(os.Stderr, "skewclock: "+f+"\n", a...)
		return code
	}
	if len(args) < 3 {
		return fail(ExitFailure, "stage: no program")
	}
	// The filter and no_new_privs belong to one thread, which must be
	// the one that execs, and the one the launcher traces: the main one.
	if unix.Gettid() != unix.Getpid() {
		return fail(ExitFailure, "stage: not on the main thread (call skew.Main from main with the thread locked in init)")
	}
	path, argv := args[1], args[2:]
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, stageEnv+"=") {
			env = append(env, kv)
		}
	}
	unix.CloseOnExec(stageFD)
	fd, err := installFilter()
	if errors.Is(err, unix.EACCES) {
		// Without CAP_SYS_ADMIN a filter needs no_new_privs.
		if err = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err == nil {
			fd, err = installFilter()
		}
	}
	if err != nil {
		return fail(ExitFailure, "seccomp user notifier: %v", err)
	}
	if err := unix.Sendmsg(stageFD, []byte{1}, unix.UnixRights(fd), nil, 0); err != nil {
		return fail(ExitFailure, "sending the notifier: %v", err)
	}
	unix.Close(fd)
	unix.Close(stageFD)
	err = unix.Exec(path, argv, env)
	code := 126
	if errors.Is(err, unix.ENOENT) {
		code = 127
	}
	return fail(code, "exec %s: %v", path, err)
}

func describe(s unix.WaitStatus) string {
	if s.Signaled() {
		return "killed by " + s.Signal().String()
	}
	return "exited " + strconv.Itoa(s.ExitStatus())
}

// dieOf ends the launcher by sig with the default action, so its parent
// sees the target's end; 128+sig if that does not end it.
func dieOf(sig unix.Signal) {
	signal.Reset()
	var act [4]uint64 // struct kernel_sigaction: handler SIG_DFL, flags, restorer, mask
	unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
	var set unix.Sigset_t
	set.Val[0] = 1 << (uint(sig) - 1)
	unix.PthreadSigmask(unix.SIG_UNBLOCK, &set, nil)
	unix.Tgkill(unix.Getpid(), unix.Gettid(), sig)
	time.Sleep(100 * time.Millisecond)
	os.Exit(128 + int(sig))
}

// TargetPID returns the pid of the program a running launcher started (its
// only child), for what the launcher cannot forward: SIGSTOP, or reading
// the target's /proc.
func TargetPID(launcher int) (int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", launcher))
	if err != nil {
		return 0, err
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			return strconv.Atoi(fields[0])
		}
	}
	return 0, fmt.Errorf("launcher %d has no child", launcher)
}
