package relay

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Start relays between a and b as Pipe does, but with no goroutine while
// both directions wait: their sockets are watched by one process-wide
// epoll set (itself waited on in Go's poller), and a goroutine is started
// to copy only when a socket has something to say, ending when it has
// nothing more. done is called once, from that goroutine, with what Pipe
// would return; the caller then closes a and b (a failure has already
// closed them). Until done, nobody else may close a or b.
//
// It returns false, having done nothing, when it cannot: an End that is
// not a bare socket (Socket or Buffered set, or a Conn without
// SyscallConn) or no epoll set. The caller then uses Pipe.
func Start(a, b End, done func(error)) bool {
	ra, okA := rawOf(a)
	rb, okB := rawOf(b)
	if !okA || !okB {
		return false
	}
	l := events()
	if l == nil {
		return false
	}
	ap := &asyncPipe{pipe: pipe{a: a.Conn, b: b.Conn}, done: done}
	ap.live.Store(2)
	ap.flows[0] = &flow{ap: ap, direction: direction{dst: b, src: a}, raw: ra}
	ap.flows[1] = &flow{ap: ap, direction: direction{dst: a, src: b}, raw: rb}
	for _, f := range ap.flows {
		f.fill, f.runFn = f.readNow, f.run
		if err := l.add(f); err != nil {
			ap.fail(err)
			f.end()
		}
	}
	return true
}

func rawOf(e End) (syscall.RawConn, bool) {
	sc, ok := e.Conn.(syscall.Conn)
	if !ok || e.Socket != nil || e.Buffered != nil {
		return nil, false
	}
	raw, err := sc.SyscallConn()
	return raw, err == nil
}

// An asyncPipe is the two flows of one Start.
type asyncPipe struct {
	pipe
	flows  [2]*flow
	live   atomic.Int32 // flows not ended
	failed atomic.Bool
	done   func(error)
}

// fail records err (the first one), takes both sockets out of the epoll
// set while they are still open, and closes both connections. Flows
// waiting end here; a running one ends at its next read.
func (ap *asyncPipe) fail(err error) {
	ap.once.Do(func() {
		if err != errEnded {
			ap.err = err
		}
		ap.failed.Store(true)
		for _, f := range ap.flows {
			if f != nil {
				f.remove()
			}
		}
		ap.a.Close()
		ap.b.Close()
	})
	for _, f := range ap.flows {
		if f != nil && f.state.CompareAndSwap(idle, ended) {
			ap.ended()
		}
	}
}

func (ap *asyncPipe) ended() {
	if ap.live.Add(-1) == 0 {
		ap.done(ap.err)
	}
}

// A flow's states: waiting in the epoll set, copying (in a goroutine),
// copying with more signalled since its last read, over.
const (
	idle int32 = iota
	running
	again
	ended
)

// A flow is one direction of an asyncPipe.
type flow struct {
	direction
	ap    *asyncPipe
	raw   syscall.RawConn // the source socket
	state atomic.Int32
	slot  uint32 // in the epoll set's table; its generation is gen
	gen   uint32
	added bool // in the epoll set

	fill  func(fd uintptr) bool // f.readNow, bound once
	runFn func()                // f.run, bound once: starting it allocates nothing
	// A read's state, between read and its callback.
	bp    *[]byte
	k, n  int
	rerr  error
	empty bool // the socket had nothing to read
}

// wake is called by the epoll set when the source socket has something to
// say (bytes, EOF or an error).
func (f *flow) wake() {
	for {
		switch s := f.state.Load(); s {
		case idle:
			if f.state.CompareAndSwap(idle, running) {
				go f.runFn()
				return
			}
		case running:
			if f.state.CompareAndSwap(running, again) {
				return
			}
		default: // again, ended
			return
		}
	}
}

// run copies until the source socket has nothing more to read, then goes
// back to waiting, unless it was signalled again meanwhile.
func (f *flow) run() {
	for {
		f.bp, f.k = borrow(f.held)
		if err := f.raw.Read(f.fill); err != nil {
			giveBack(f.bp)
			f.bp = nil
			f.ap.fail(err)
			f.end()
			return
		}
		bp, k, n, rerr, empty := f.bp, f.k, f.n, f.rerr, f.empty
		f.bp, f.n, f.rerr, f.empty = nil, 0, nil, false
		if empty {
			giveBack(bp)
			if f.state.CompareAndSwap(running, idle) {
				if f.ap.failed.Load() && f.state.CompareAndSwap(idle, ended) {
					f.ap.ended()
				}
				return
			}
			if !f.state.CompareAndSwap(again, running) {
				return // ended by a failure
			}
			continue
		}
		if done, err := f.pass(bp, k, n, rerr); done {
			if err != nil {
				f.ap.fail(err)
			} else {
				f.remove() // EOF passed on: nothing more to watch
			}
			f.end()
			return
		}
	}
}

// end marks the flow over, once.
func (f *flow) end() {
	if f.state.Swap(ended) != ended {
		f.ap.ended()
	}
}

// readNow reads from fd once, without waiting: with nothing to read it
// notes that the socket is empty.
func (f *flow) readNow(fd uintptr) bool {
	n, err := syscall.Read(int(fd), (*f.bp)[f.k:])
	switch {
	case err == syscall.EAGAIN:
		f.empty = true
	case err == syscall.EINTR:
		return f.readNow(fd)
	case err != nil:
		f.rerr = os.NewSyscallError("read", err)
	case n == 0:
		f.rerr = io.EOF
	default:
		f.n = n
	}
	return true
}

// remove takes the source socket out of the epoll set, while it is open.
func (f *flow) remove() {
	if l := events(); l != nil {
		l.remove(f)
	}
}

// The epoll set: one per process, with a table of its flows.
type epollSet struct {
	fd   int
	mu   sync.Mutex
	tab  []*flow // by slot
	gens []uint32
	free []uint32
	evs  [128]unix.EpollEvent // the waiting goroutine's
}

var (
	setOnce sync.Once
	set     *epollSet
)

// events returns the process's epoll set, started on first use; nil if
// there can be none.
func events() *epollSet {
	setOnce.Do(func() {
		s, err := newEpollSet()
		if err == nil {
			set = s
		}
	})
	return set
}

func newEpollSet() (*epollSet, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// A non-blocking descriptor becomes pollable: Go's poller tells when
	// the set has events.
	file := os.NewFile(uintptr(fd), "relay-epoll")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return nil, err
	}
	s := &epollSet{fd: fd}
	go func() {
		for {
			if err := raw.Read(s.collect); err != nil {
				panic("relay: waiting on the epoll set: " + err.Error()) // never closed
			}
		}
	}()
	return s, nil
}

// collect takes the set's events without waiting and wakes their flows;
// with none left, it returns false for Go's poller to wait.
func (s *epollSet) collect(uintptr) bool {
	for {
		n, err := unix.EpollWait(s.fd, s.evs[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			panic("relay: epoll_wait: " + err.Error())
		}
		for _, ev := range s.evs[:n] {
			if f := s.lookup(uint32(ev.Fd), uint32(ev.Pad)); f != nil {
				f.wake()
			}
		}
		if n < len(s.evs) {
			return false
		}
	}
}

func (s *epollSet) lookup(slot, gen uint32) *flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(slot) < len(s.tab) && s.gens[slot] == gen {
		return s.tab[slot]
	}
	return nil
}

// add watches f's source socket, edge-triggered: an event for every
// arrival, bytes already there included.
func (s *epollSet) add(f *flow) error {
	s.mu.Lock()
	if n := len(s.free); n > 0 {
		f.slot = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		f.slot = uint32(len(s.tab))
		s.tab = append(s.tab, nil)
		s.gens = append(s.gens, 0)
	}
	s.tab[f.slot], f.gen, f.added = f, s.gens[f.slot], true
	s.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(f.slot), Pad: int32(f.gen)}
	var err error
	if cerr := f.raw.Control(func(fd uintptr) { err = unix.EpollCtl(s.fd, unix.EPOLL_CTL_ADD, int(fd), &ev) }); cerr != nil {
		err = cerr
	}
	if err != nil {
		s.release(f)
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// remove stops watching f's source socket; a later event of its slot is
// dropped (the generation moves on).
func (s *epollSet) remove(f *flow) {
	f.raw.Control(func(fd uintptr) { unix.EpollCtl(s.fd, unix.EPOLL_CTL_DEL, int(fd), nil) })
	s.release(f)
}

func (s *epollSet) release(f *flow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !f.added {
		return
	}
	f.added = false
	s.tab[f.slot] = nil
	s.gens[f.slot]++
	s.free = append(s.free, f.slot)
}

// Own returns a second connection on c's socket, which stays open when c
// is closed: a handler whose caller closes c on return (caddy-l4 does)
// can return and leave the socket relayed by Start.
func Own(c *net.TCPConn) (*net.TCPConn, error) {
	f, err := c.File() // a duplicate descriptor, still non-blocking
	if err != nil {
		return nil, err
	}
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return nc.(*net.TCPConn), nil
}
