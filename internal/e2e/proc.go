package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is one running program whose output is captured.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
	err  error
}

// Start runs bin with args and env (added to the test's environment). The
// program is stopped, and its output logged if the test failed, when the
// test ends.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	SkipShort(t)
	p := &Proc{Name: name, out: &logBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(p.cmd.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = dieWithParent()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("--- output of %s (%s):\n%s", name, p.cmd.String(), p.Logs())
		}
	})
	return p
}

// Stop sends SIGTERM, waits up to 15 s, then kills. It returns the exit error.
func (p *Proc) Stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// Kill stops the program at once with SIGKILL, as a crash would.
func (p *Proc) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the program (SIGSTOP and SIGCONT pause and resume
// it, as a GC pause or a stalled VM would).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited reports whether the program has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Logs returns everything the program wrote so far.
func (p *Proc) Logs() string { return p.out.String() }

// WaitFor polls ready every 50 ms until it returns nil, the program exits, or
// timeout passes; it fails the test in the latter two cases.
func (p *Proc) WaitFor(t testing.TB, what string, timeout time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return
		}
		if p.Exited() {
			t.Fatalf("%s exited (%v) while waiting for %s; last error: %v\n%s", p.Name, p.err, what, err, p.Logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not ready after %v: %v", p.Name, what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitTCP waits until addr accepts TCP connections.
func (p *Proc) WaitTCP(t testing.TB, addr string) {
	t.Helper()
	p.WaitFor(t, "tcp "+addr, 30*time.Second, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// handedOut holds every port FreePort has returned in this process: a test
// that asks for two addresses (an admin API and a listener) must never get
// one port twice. Caddy binds with SO_REUSEPORT, so both would start and
// share the port's connections.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
	locks *os.File // byte N locked: port N is this process's
}{ports: map[int]bool{}}

// claim reserves port against the other test processes of the run (go
// test runs packages side by side): a POSIX lock on byte port of one
// shared file, held until this process exits. Without the file, only the
// bind check guards.
func claim(port int) bool {
	if handedOut.locks == nil {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "edgesteer-e2e-ports"), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return true
		}
		handedOut.locks = f
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: int64(port), Len: 1}
	err := syscall.FcntlFlock(handedOut.locks.Fd(), syscall.F_SETLK, &lk)
	return err == nil || !(errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES))
}

// freeRange is where FreePort looks: below the kernel's ephemeral range, so
// a port handed out but not yet bound by the program it is for cannot be
// taken meanwhile by a test's own Listen(":0") or by an outgoing
// connection's source port, and below 20000, where the portrange tests
// bind their source ports. Empty when the ephemeral range starts too low to
// leave room; FreePort then asks the kernel for an ephemeral port.
func freeRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil || first < 12000 {
		return 0, 0
	}
	return 10000, min(first, 20000)
}

// browserRefuses says whether Chromium refuses to load pages from port
// (net::ERR_UNSAFE_PORT): the dashboard tests open test addresses in it.
// The list is Chromium's restricted ports at or above 1024.
func browserRefuses(port int) bool {
	switch port {
	case 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566,
		6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080:
		return true
	}
	return port > 0 && port < 1024
}

// FreePort returns a loopback TCP port that was free a moment ago, whose
// UDP twin is free too (so it can serve DNS on both), and that no earlier
// call in this process, nor in another test process running meanwhile,
// returned.
func FreePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	lo, hi := freeRange()
	for range 500 {
		port := 0
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		if handedOut.ports[port] || browserRefuses(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			if port == 0 {
				t.Fatal(err)
			}
			continue // in use
		}
		port = l.Addr().(*net.TCPAddr).Port
		if browserRefuses(port) {
			l.Close()
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil && !handedOut.ports[port] && claim(port) {
			u.Close()
			handedOut.ports[port] = true
			return port
		}
		if err == nil {
			u.Close()
		}
	}
	t.Fatal("no free loopback port")
	return 0
}

// Addr returns "127.0.0.1:<a free port>".
func Addr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ClosingListener starts a loopback TCP listener that accepts and at once
// closes every connection (a TCP-probe target), closed when the test ends,
// and returns its address.
func ClosingListener(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

// WaitLog waits up to timeout for the program's output to contain s (its
// output reaches us through a pipe, a moment after it is written).
func (p *Proc) WaitLog(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !strings.Contains(p.Logs(), s); {
		if time.Now().After(deadline) {
			t.Fatalf("%s never logged %q", p.Name, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the program's process id (for reading its CPU time).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }
