package relay

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Start relays between a and b as Pipe does, but with no goroutine while
// both directions are idle. Each direction starts with a goroutine, which
// copies as Pipe does (waiting in Go's poller, reading to an empty
// socket), and gives it back once the direction has been silent for Prime
// (before its first bytes) or Linger (after them); the socket is then
// watched by an epoll set (one per GOMAXPROCS, each waited on in Go's
// poller by one goroutine), whose next event for it starts the direction's
// goroutine again. A busy connection is relayed at
// Pipe's speed; an idle one holds no goroutine and no buffer. done is
// called once, in a goroutine of its own, with what Pipe would return;
// the caller then closes a and b (a failure has already closed them).
// Until done, nobody else may close a or b, nor set their read deadlines:
// a closed socket leaves the epoll set silently.
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
	ap.flows[0] = &flow{ap: ap, direction: direction{dst: b, src: a}, raw: ra, set: l}
	ap.flows[1] = &flow{ap: ap, direction: direction{dst: a, src: b}, raw: rb, set: l}
	// Both directions start running, as Pipe's would: a connection handed
	// over has just exchanged a message, and its next one is likely close
	// behind. A direction waits Prime for it, not Linger: a burst of new
	// connections that then stay idle does not hold two goroutines each
	// for long. A socket joins the epoll set when its direction first
	// parks.
	for _, f := range ap.flows {
		f.runFn = f.run
		f.state.Store(running)
		f.primed = true
		go f.runFn()
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
			f.set.release(f) // added after the remove above, if it raced with it
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
// copying with an event since its socket was put back in the set, over.
const (
	idle int32 = iota
	running
	again
	ended
)

// Linger is how long a direction stays silent before its goroutine is
// given back and its socket watched by the epoll set again.
var Linger = time.Second

// Prime is how long a direction started by Start waits for its first
// bytes before it is parked in the same way.
var Prime = 50 * time.Millisecond

// A flow is one direction of an asyncPipe.
type flow struct {
	direction
	ap     *asyncPipe
	raw    syscall.RawConn // the source socket
	w      *waiter         // reads it, waiting in Go's poller (direct reads)
	set    *epollSet
	state  atomic.Int32
	slot   uint32 // in the epoll set's table; its generation is gen
	gen    uint32
	added  bool   // in the epoll set's table (guarded by the set's mu)
	joined bool   // added once (the flow's goroutine's own)
	primed bool   // started by Start, nothing read yet: waits Prime
	runFn  func() // f.run, bound once: starting it allocates nothing
}

// wake is called by the epoll set's goroutine when the source socket has
// something to say (bytes, EOF or an error). The socket is out of the set
// (one-shot) until the flow's goroutine puts it back.
func (f *flow) wake() {
	for {
		switch f.state.Load() {
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

// run copies as Pipe does until the source has been silent for Linger,
// then puts the socket back in the epoll set and ends, unless an event
// came meanwhile.
func (f *flow) run() {
	if f.w == nil {
		f.w = newWaiter(f.src) // only once the direction has had something to say
	}
	conn := f.src.Conn
	wait := Linger
	if f.primed {
		wait, f.primed = Prime, false
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	var reads, seen uint64
	for {
		bp, k, n, rerr, err := f.w.read(f.held)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if reads == seen && f.park() {
				return
			}
			seen = reads // busy since the deadline was set: wait another Linger
			conn.SetReadDeadline(time.Now().Add(Linger))
			continue
		}
		if err != nil {
			f.conclude(err)
			return
		}
		reads++
		if ended, err := f.pass(bp, k, n, rerr); ended {
			f.conclude(err)
			return
		}
	}
}

// park puts the socket back in the epoll set and the flow to idle; false
// if an event came after the socket was back (the flow goes on running).
func (f *flow) park() bool {
	watch := f.set.rearm
	if !f.joined {
		watch, f.joined = f.set.add, true
	}
	if err := watch(f); err != nil {
		f.conclude(err)
		return true
	}
	if parkHook != nil {
		parkHook(f)
	}
	if f.state.CompareAndSwap(running, idle) {
		if f.ap.failed.Load() && f.state.CompareAndSwap(idle, ended) {
			f.set.release(f) // added after fail took the flows out
			f.ap.ended()
		}
		return true
	}
	f.state.CompareAndSwap(again, running)
	return false
}

// parkHook, set only by tests (nil in production: one load and a
// branch), runs in park after the socket is back in the epoll set and
// before the flow turns idle: the window in which the other direction's
// failure takes the sockets out of the set and finds this flow still
// running, so that only park's own check can end it.
var parkHook func(*flow)

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

// end marks the flow over, once.
func (f *flow) end() {
	if f.state.Swap(ended) != ended {
		f.ap.ended()
	}
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

// add watches f's source socket, one-shot: its first event (bytes
// already there included) takes it out of the set until rearm. Only
// f's own goroutine adds or rearms it.
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
	if err := s.ctl(f, unix.EPOLL_CTL_ADD); err != nil {
		s.release(f)
		return err
	}
	return nil
}

// rearm puts f's socket back in the set after its event; an event is
// raised at once if the socket already has something to say.
func (s *epollSet) rearm(f *flow) error { return s.ctl(f, unix.EPOLL_CTL_MOD) }

func (s *epollSet) ctl(f *flow, op int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(f.slot), Pad: int32(f.gen)}
	var err error
	if cerr := f.raw.Control(func(fd uintptr) { err = unix.EpollCtl(s.fd, op, int(fd), &ev) }); cerr != nil {
		err = cerr
	}
	if err != nil {
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
