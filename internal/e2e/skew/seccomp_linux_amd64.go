//go:build linux && amd64

package skew

// The clock-read answering: the seccomp filter the stage process installs,
// and the launcher's servers that answer the wall-clock reads it sends
// them, shifted by the offset.

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
