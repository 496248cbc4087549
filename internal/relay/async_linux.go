package relay

import (
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Start relays between a and b as Pipe does, but with no goroutine while
// both directions wait. Their sockets are watched by an epoll set (one per
// GOMAXPROCS, each waited on in Go's poller by one goroutine); when a
// socket has something to say, that goroutine reads it and writes it on
// without blocking, and hands the direction to a goroutine of its own
// only when the write would block or the socket keeps having more (after
// a few reads), until the socket is empty again. done is called once,
// in a goroutine of its own, with what Pipe would return; the caller then
// closes a and b (a failure has already closed them). Until done, nobody
// else may close a or b: a closed socket leaves the epoll set silently.
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
	l := pickSet()
	if l == nil {
		return false
	}
	ap := &asyncPipe{pipe: pipe{a: a.Conn, b: b.Conn}, done: done}
	ap.live.Store(2)
	ap.flows[0] = &flow{ap: ap, direction: direction{dst: b, src: a}, raw: ra, dstRaw: rb, set: l}
	ap.flows[1] = &flow{ap: ap, direction: direction{dst: a, src: b}, raw: rb, dstRaw: ra, set: l}
	// Both flows stay running (an event only marks them again) until both
	// are in the set: nothing serves half a pipe, and a failure to add
	// one ends both here.
	var err error
	for _, f := range ap.flows {
		f.fill, f.put, f.runFn = f.readNow, f.writeSome, f.run
		f.state.Store(running)
		if err == nil {
			err = l.add(f)
		}
	}
	if err != nil {
		ap.fail(err)
		for _, f := range ap.flows {
			f.end()
		}
		return true
	}
	for _, f := range ap.flows {
		if !f.state.CompareAndSwap(running, idle) { // an event came meanwhile
			f.state.Store(running)
			go f.runFn()
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
				f.set.remove(f)
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
		go ap.done(ap.err) // not on an epoll set's goroutine
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
	ap     *asyncPipe
	raw    syscall.RawConn // the source socket
	dstRaw syscall.RawConn // the destination socket, for writes that must not block
	set    *epollSet
	state  atomic.Int32
	// closing: the peer has closed or failed (an event said so): read until
	// the socket says EOF or the error, not only until a short read.
	closing atomic.Bool
	slot    uint32 // in the epoll set's table; its generation is gen
	gen     uint32
	added   bool // in the epoll set

	fill  func(fd uintptr) bool // f.readNow, bound once
	put   func(fd uintptr) bool // f.writeNow, bound once
	runFn func()                // f.run, bound once: starting it allocates nothing
	// A read's or a write's state, between the call and its callback.
	bp    *[]byte
	k, n  int
	rerr  error
	empty bool // the socket had nothing to read
	out   []byte
	wrote int
	werr  error
	// Left by the epoll set's goroutine for the flow's own: bytes not yet
	// written (a write that would have blocked), and the errors that decide
	// the direction's end once they are.
	unwritten   []byte
	ferr, rerr2 error
}

// inlineReads bounds the reads the epoll set's goroutine does for one
// event before handing the flow to a goroutine of its own, so one busy
// socket does not hold up the others.
const inlineReads = 4

// wake is called by the epoll set's goroutine when the source socket has
// something to say (bytes, EOF or an error): events are the epoll event's.
func (f *flow) wake(events uint32) {
	if events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 && !f.closing.Load() {
		f.closing.Store(true)
	}
	for {
		switch s := f.state.Load(); s {
		case idle:
			if f.state.CompareAndSwap(idle, running) {
				f.serve(true)
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

// run is the flow's own goroutine: it finishes what the epoll set's
// goroutine handed over, then copies until the socket is empty.
func (f *flow) run() {
	if f.unwritten != nil {
		_, werr := f.dst.Conn.Write(f.unwritten)
		f.unwritten = nil
		if ended, err := f.after(f.ferr, f.rerr2, werr); ended {
			f.conclude(err)
			return
		}
		f.ferr, f.rerr2 = nil, nil
	}
	f.serve(false)
}

// serve copies until the source socket has nothing more to read, then
// goes back to waiting, unless it was signalled again meanwhile. A read
// that does not fill the buffer has taken all there was when the event
// was collected: bytes that arrived since raise an event of their own
// (edge-triggered epoll signals each arrival after an event is collected),
// so serve stops there without the read that would find the socket empty,
// unless the peer has closed (a FIN that came with the bytes raises no
// event of its own: then it reads on to the EOF). Inline
// (on the epoll set's goroutine) it never blocks: a write that would, or
// more than inlineReads reads, hand the flow to run.
func (f *flow) serve(inline bool) {
	for reads := 0; ; reads++ {
		if inline && reads == inlineReads {
			go f.runFn()
			return
		}
		f.bp, f.k = borrow(f.held)
		if err := f.raw.Read(f.fill); err != nil {
			giveBack(f.bp)
			f.bp = nil
			f.conclude(err)
			return
		}
		bp, k, n, rerr, empty := f.bp, f.k, f.n, f.rerr, f.empty
		f.bp, f.n, f.rerr, f.empty = nil, 0, nil, false
		if !empty {
			short := k+n < len(*bp) && rerr == nil
			out, ferr := f.take(bp, k, n)
			var werr error
			if len(out) > 0 {
				if inline {
					var w int
					w, werr = f.writeNow(out)
					if werr == nil && w < len(out) { // the write would block
						f.unwritten = append([]byte(nil), out[w:]...)
						f.ferr, f.rerr2 = ferr, rerr
						giveBack(bp)
						go f.runFn()
						return
					}
				} else {
					_, werr = f.dst.Conn.Write(out)
				}
			}
			giveBack(bp)
			if ended, err := f.after(ferr, rerr, werr); ended {
				f.conclude(err)
				return
			}
			if !short || f.closing.Load() {
				continue
			}
		} else {
			giveBack(bp)
		}
		// Drained: wait again, unless an event came meanwhile.
		if f.state.CompareAndSwap(running, idle) {
			if f.ap.failed.Load() && f.state.CompareAndSwap(idle, ended) {
				f.ap.ended()
			}
			return
		}
		if !f.state.CompareAndSwap(again, running) {
			return // ended by a failure
		}
	}
}

// conclude ends the flow: nil for an EOF passed on, else a failure that
// ends the pipe.
func (f *flow) conclude(err error) {
	if err != nil {
		f.ap.fail(err)
	} else {
		f.set.remove(f) // EOF passed on: nothing more to watch
	}
	f.end()
}

// writeNow writes b to the destination socket once, without waiting: it
// returns how much was written (0 if the socket's buffer is full).
func (f *flow) writeNow(b []byte) (int, error) {
	f.out = b
	err := f.dstRaw.Write(f.put)
	n, werr := f.wrote, f.werr
	f.out, f.wrote, f.werr = nil, 0, nil
	if err != nil {
		return n, err
	}
	return n, werr
}

func (f *flow) writeSome(fd uintptr) bool {
	for f.wrote < len(f.out) {
		n, err := syscall.Write(int(fd), f.out[f.wrote:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return true
		case err != nil:
			f.werr = os.NewSyscallError("write", err)
			return true
		}
		f.wrote += n
	}
	return true
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

// An epoll set, with a table of its flows.
type epollSet struct {
	fd   int
	mu   sync.Mutex
	tab  []*flow // by slot
	gens []uint32
	free []uint32
	evs  [128]unix.EpollEvent // the waiting goroutine's
}

var (
	setsOnce sync.Once
	sets     []*epollSet
	nextSet  atomic.Uint32
)

// pickSet returns one of the process's epoll sets (one per GOMAXPROCS at
// first use), in turn; nil if there can be none.
func pickSet() *epollSet {
	setsOnce.Do(func() {
		for range runtime.GOMAXPROCS(0) {
			s, err := newEpollSet()
			if err != nil {
				return
			}
			sets = append(sets, s)
		}
	})
	if len(sets) == 0 {
		return nil
	}
	return sets[int(nextSet.Add(1))%len(sets)]
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
				f.wake(ev.Events)
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
