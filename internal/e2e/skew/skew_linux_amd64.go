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
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("socketpair: %w", err))
	}
	mine, theirs := fds[0], os.NewFile(uintptr(fds[1]), "skewclock-stage")

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)

	env := append(os.Environ(), stageEnv+"=1")
	proc, err := os.StartProcess("/proc/self/exe", append([]string{os.Args[0], path}, argv...), &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr, theirs},
		Sys:   &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL},
	})
	theirs.Close()
	if err != nil {
		return fail(err)
	}
	pid := proc.Pid
	go func() {
		for s := range sigs {
			proc.Signal(s)
		}
	}()

	// The notifier arrives from the child before it execs the target;
	// answering starts at once, whatever the tracing below is doing.
	var served atomic.Int64
	notifier := make(chan error, 1)
	go func() {
		fd, err := receiveFD(mine)
		unix.Close(mine)
		if err == nil {
			// The caller and the answer hand over on one CPU (6.6+).
			unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, syncWakeUp)
			for range max(2, runtime.NumCPU()) {
				go serve(fd, offset, &served)
			}
		}
		notifier <- err
	}()

	status, done, err := startTarget(pid, logf)
	if err != nil {
		unix.Kill(pid, unix.SIGKILL)
		unix.Wait4(pid, nil, 0, nil)
		return fail(err)
	}
	if !done {
		select {
		case err = <-notifier:
		case <-time.After(10 * time.Second):
			err = errors.New("no notifier from the stage process")
		}
		if err != nil {
			unix.Kill(pid, unix.SIGKILL)
			unix.Wait4(pid, nil, 0, nil)
			return fail(err)
		}
		logf("pid %d runs %s, wall clock %+v", pid, path, offset)
		for {
			_, err = unix.Wait4(pid, &status, 0, nil)
			if err != unix.EINTR {
				break
			}
		}
		if err != nil {
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

// seccomp_data offsets.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16 // low 32 bits on little-endian: clockid_t is an int
)

// filter sends the wall-clock reads of x86-64 system calls to the
// notifier and lets everything else through.
func filter() []unix.SockFilter {
	ld := func(k uint32) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: k}
	}
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jt: jt, Jf: jf}
	}
	ret := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k} }
	return []unix.SockFilter{
		/* 0 */ ld(offArch),
		/* 1 */ jeq(unix.AUDIT_ARCH_X86_64, 0, 7), // else → 9
		/* 2 */ ld(offNr),
		/* 3 */ jeq(unix.SYS_CLOCK_GETTIME, 2, 0), // → 6
		/* 4 */ jeq(unix.SYS_GETTIMEOFDAY, 5, 0), // → 10
		/* 5 */ jeq(unix.SYS_TIME, 4, 3), // → 10, else → 9
		/* 6 */ ld(offArg0),
		/* 7 */ jeq(unix.CLOCK_REALTIME, 2, 0), // → 10
		/* 8 */ jeq(unix.CLOCK_REALTIME_COARSE, 1, 0), // → 10, else → 9
		/* 9 */ ret(unix.SECCOMP_RET_ALLOW),
		/* 10 */ ret(unix.SECCOMP_RET_USER_NOTIF),
	}
}

func installFilter() (int, error) {
	prog := filter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// syncWakeUp is SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP.
const syncWakeUp = 1

// seccompNotif and seccompNotifResp are struct seccomp_notif and
// struct seccomp_notif_resp (linux/seccomp.h).
type seccompNotif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

type seccompNotifResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// serve answers the notifier's calls until it fails for good.
func serve(fd int, offset time.Duration, served *atomic.Int64) {
	for {
		var n seccompNotif
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_RECV,
			uintptr(unsafe.Pointer(&n))); e != 0 {
			if e == unix.EINTR || e == unix.ENOENT { // interrupted; the caller gone meanwhile
				continue
			}
			return
		}
		r := answer(fd, &n, offset)
		if r.error == 0 {
			served.Add(1)
		}
		// ENOENT: the caller was interrupted by a signal meanwhile; its
		// call restarts and comes again.
		unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r)))
	}
}

// answer does what the kernel would have done for the call in n, with the
// wall clock offset: it writes the result into the caller's memory.
func answer(fd int, n *seccompNotif, offset time.Duration) seccompNotifResp {
	r := seccompNotifResp{id: n.id}
	var out [16]byte
	var dst uint64
	var size int
	switch n.nr {
	case unix.SYS_CLOCK_GETTIME:
		var sec, nsec int64
		if int32(n.args[0]) == unix.CLOCK_REALTIME_COARSE {
			var ts unix.Timespec
			unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts)
			sec, nsec = split(time.Unix(ts.Sec, ts.Nsec).Add(offset).UnixNano())
		} else {
			sec, nsec = split(time.Now().Add(offset).UnixNano())
		}
		*(*[2]int64)(unsafe.Pointer(&out[0])) = [2]int64{sec, nsec}
		dst, size = n.args[1], 16
	case unix.SYS_GETTIMEOFDAY:
		if n.args[1] != 0 { // the timezone, as the kernel has it
			var tz [2]int32
			unix.RawSyscall(unix.SYS_GETTIMEOFDAY, 0, uintptr(unsafe.Pointer(&tz)), 0)
			if r.error = write(fd, n, n.args[1], (*[8]byte)(unsafe.Pointer(&tz))[:]); r.error != 0 {
				return r
			}
		}
		sec, nsec := split(time.Now().Add(offset).UnixNano())
		*(*[2]int64)(unsafe.Pointer(&out[0])) = [2]int64{sec, nsec / 1000}
		dst, size = n.args[0], 16
	case unix.SYS_TIME:
		sec, _ := split(time.Now().Add(offset).UnixNano())
		*(*int64)(unsafe.Pointer(&out[0])) = sec
		r.val = sec
		dst, size = n.args[0], 8
	default:
		r.error = -int32(unix.ENOSYS)
		return r
	}
	if dst == 0 {
		if n.nr == unix.SYS_CLOCK_GETTIME {
			r.error = -int32(unix.EFAULT)
		}
		return r // gettimeofday(NULL, …) and time(NULL) only return
	}
	r.error = write(fd, n, dst, out[:size])
	return r
}

// write copies b to addr in the caller of n, once the notifier confirms
// that n.pid is still that caller, and returns 0 or a negative errno.
func write(fd int, n *seccompNotif, addr uint64, b []byte) int32 {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_ID_VALID,
		uintptr(unsafe.Pointer(&n.id))); e != 0 {
		return -int32(unix.ENOENT)
	}
	local := []unix.Iovec{{Base: &b[0], Len: uint64(len(b))}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	if m, err := unix.ProcessVMWritev(int(n.pid), local, remote, 0); err != nil || m != len(b) {
		return -int32(unix.EFAULT)
	}
	return 0
}

func split(ns int64) (sec, nsec int64) {
	sec, nsec = ns/1e9, ns%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	return sec, nsec
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
