package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// relayed starts Pipe between a client and an upstream connection; the
// channel gives its result.
func relayed(t testing.TB, client, upstream End) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- Pipe(client, upstream) }()
	return done
}

// started is relayed through Start (where it is available).
func started(t testing.TB, client, upstream End) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	if !Start(client, upstream, func(err error) { done <- err }) {
		t.Skip("Start is not available here")
	}
	return done
}

// bothWays runs a test once through Pipe and once through Start.
func bothWays(t *testing.T, test func(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error)) {
	t.Run("Pipe", func(t *testing.T) { test(t, relayed) })
	t.Run("Start", func(t *testing.T) { test(t, started) })
}

func readAll(t testing.TB, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading: %v", err)
	}
	return b
}

func result(t testing.TB, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Pipe did not return")
		return nil
	}
}

// An EOF from the client is passed on as a half-close; the node's answer
// still flows back, and its close ends the relay without an error.
func TestHalfClose(t *testing.T) {
	bothWays(t, func(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error) {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		done := relay(t, End{Conn: client}, End{Conn: upstream})

		clientPeer.Write([]byte("question"))
		clientPeer.CloseWrite()
		if got := readAll(t, nodePeer); string(got) != "question" {
			t.Fatalf("node got %q", got)
		}
		nodePeer.Write([]byte("answer after the client's EOF"))
		nodePeer.Close()
		if got := readAll(t, clientPeer); string(got) != "answer after the client's EOF" {
			t.Fatalf("client got %q", got)
		}
		if err := result(t, done); err != nil {
			t.Fatalf("Pipe: %v", err)
		}
	})
}

// A connection reset is an error: Pipe returns it and closes the other
// connection, which was idle.
func TestResetClosesBoth(t *testing.T) {
	bothWays(t, func(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error) {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		done := relay(t, End{Conn: client}, End{Conn: upstream})

		nodePeer.SetLinger(0)
		nodePeer.Close() // RST
		if err := result(t, done); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Pipe after a reset: %v", err)
		}
		clientPeer.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := clientPeer.Read(make([]byte, 1)); n != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("client connection still open: %d %v", n, err)
		}
	})
}

// lengthFramed is a Filter for messages of a 4-byte length and a body; it
// passes nothing of a message until it has all of it, and refuses a body
// starting with "evil".
type lengthFramed struct{ sizes []int }

func (f *lengthFramed) Feed(b []byte) (int, error) {
	i := 0
	for len(b)-i >= 4 {
		n := 4 + int(binary.BigEndian.Uint32(b[i:]))
		if len(b)-i < n {
			break
		}
		if bytes.HasPrefix(b[i+4:i+n], []byte("evil")) {
			return i, errors.New("evil message")
		}
		f.sizes = append(f.sizes, n)
		i += n
	}
	return i, nil
}

func frame(body string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// A message longer than the buffer, arriving in small pieces, reaches the
// Filter whole and the node unchanged; a refused message is not passed on
// and the error comes back from Pipe.
func TestFilterHoldsSplitMessages(t *testing.T) {
	bothWays(t, func(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error) {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		filterHoldsSplitMessages(t, relay, clientPeer, nodePeer, End{Conn: client}, End{Conn: upstream})
	})
}

// The same through a wrapper read after a peek (End.Socket without Direct).
func TestFilterHoldsSplitMessagesPeeking(t *testing.T) {
	clientPeer, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	filterHoldsSplitMessages(t, relayed, clientPeer, nodePeer, End{Conn: &prefetched{Conn: client}, Socket: client}, End{Conn: upstream})
}

func filterHoldsSplitMessages(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error,
	clientPeer, nodePeer net.Conn, client, upstream End) {
	f := &lengthFramed{}
	client.Filter = f
	done := relay(t, client, upstream)

	big := strings.Repeat("x", 3*BufferSize+17)
	stream := append(append(frame("small"), frame(big)...), frame("after")...)
	go func() {
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1000)
			clientPeer.Write(rest[:n])
			rest = rest[n:]
			time.Sleep(time.Millisecond) // separate reads on the relay's side
		}
		clientPeer.Write(frame("evil"))
	}()
	got := readAll(t, nodePeer)
	if !bytes.Equal(got, stream) {
		t.Fatalf("node got %d bytes, want the %d before the refused message", len(got), len(stream))
	}
	if err := result(t, done); err == nil || err.Error() != "evil message" {
		t.Fatalf("Pipe: %v", err)
	}
	if want := []int{9, 4 + len(big), 9}; len(f.sizes) != 3 || f.sizes[1] != want[1] {
		t.Fatalf("the filter saw messages of %v bytes, want %v", f.sizes, want)
	}
}

// An EOF inside a message the Filter holds back is an unexpected EOF: the
// partial message is not passed on.
func TestEOFInsideHeldMessage(t *testing.T) {
	bothWays(t, func(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error) {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		done := relay(t, End{Conn: client, Filter: &lengthFramed{}}, End{Conn: upstream})
		clientPeer.Write(frame("whole"))
		clientPeer.Write(frame("partial")[:6])
		clientPeer.CloseWrite()
		if err := result(t, done); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Pipe: %v", err)
		}
		if got := readAll(t, nodePeer); !bytes.Equal(got, frame("whole")) {
			t.Fatalf("node got %q", got)
		}
	})
}

// prefetched wraps a connection that has read some bytes ahead, as
// caddy-l4's Connection does for its matchers.
type prefetched struct {
	net.Conn
	ahead []byte
}

func (p *prefetched) Read(b []byte) (int, error) {
	if len(p.ahead) > 0 {
		n := copy(b, p.ahead)
		p.ahead = p.ahead[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// Bytes a wrapper holds are read without waiting for the socket, which has
// nothing more to say; then the socket is waited on and half-closed.
func TestBufferedBytesFirst(t *testing.T) {
	readAheadThenSocket(t, false)
}

// With Direct, a wrapper's read-ahead bytes are read through it; the rest
// straight from the socket, not through the wrapper.
func TestDirectReadsBufferedFirst(t *testing.T) {
	if n := readAheadThenSocket(t, true); n != 0 {
		t.Fatalf("%d reads went through the wrapper to the socket, want 0", n)
	}
}

// readAheadThenSocket relays a client whose wrapper holds "read ahead;"
// and whose socket then sends " then the socket" and half-closes: the node
// must get both, in order, and the relay end without an error. It returns
// the reads that went through the wrapper to the socket.
func readAheadThenSocket(t *testing.T, direct bool) int32 {
	clientPeer, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	wrapped := &countingPrefetched{prefetched: prefetched{Conn: client, ahead: []byte("read ahead;")}}
	done := relayed(t, End{Conn: wrapped, Socket: client, Direct: direct, Buffered: func() int { return len(wrapped.ahead) }},
		End{Conn: upstream})

	buf := make([]byte, 64)
	nodePeer.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.ReadAtLeast(nodePeer, buf, len("read ahead;"))
	if err != nil || string(buf[:n]) != "read ahead;" {
		t.Fatalf("node got %q %v", buf[:n], err)
	}
	clientPeer.Write([]byte(" then the socket"))
	clientPeer.CloseWrite()
	if got := readAll(t, nodePeer); string(got) != " then the socket" {
		t.Fatalf("node got %q", got)
	}
	nodePeer.Close()
	if err := result(t, done); err != nil {
		t.Fatalf("Pipe: %v", err)
	}
	return wrapped.socketReads.Load()
}

type countingPrefetched struct {
	prefetched
	socketReads atomic.Int32
}

func (p *countingPrefetched) Read(b []byte) (int, error) {
	if len(p.ahead) == 0 {
		p.socketReads.Add(1)
	}
	return p.prefetched.Read(b)
}

// Connections without a socket to wait on (net.Pipe) still relay; one that
// cannot be half-closed ends the relay at its EOF without an error.
func TestWithoutSocket(t *testing.T) {
	clientPeer, client := net.Pipe()
	upstream, nodePeer := net.Pipe()
	done := relayed(t, End{Conn: client}, End{Conn: upstream})
	go func() {
		clientPeer.Write([]byte("over a pipe"))
		clientPeer.Close()
	}()
	if got := readAll(t, nodePeer); string(got) != "over a pipe" {
		t.Fatalf("node got %q", got)
	}
	if err := result(t, done); err != nil {
		t.Fatalf("Pipe: %v", err)
	}
}

// mallocs is the exact number of heap allocations the process makes
// during n calls of op, the relay's goroutines included (AllocsPerRun
// returns an average rounded down: anything under one allocation per
// operation would read 0). It counts up to three times, with the
// collector off throughout, and returns the smallest count: what the
// runtime allocates once after a collection or a burst of load (a
// sync.Pool's per-P array and ring, refilled on whichever P a goroutine
// runs next; a timer heap's growth; a read deadline that expired while
// the machine was stalled) does not come back in the next count, where
// an allocation per message, or per ten, would be in every one.
// GOMAXPROCS is left alone: AllocsPerRun's switch to 1 empties the
// runtime's per-P timer heaps, whose regrowth the relay's next read
// deadline would be charged with.
func mallocs(n int, op func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // returns once no collection runs
	op()
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			op()
		}
		runtime.ReadMemStats(&after)
		if least = min(least, after.Mallocs-before.Mallocs); least == 0 {
			break
		}
	}
	return least
}

// Waiting for a readable socket allocates nothing.
func TestWaitAllocatesNothing(t *testing.T) {
	peer, c := e2e.TCPPair(t)
	peer.Write([]byte("x"))
	w := newWaiter(End{Conn: c})
	if w.raw == nil {
		t.Fatal("no raw connection to wait on")
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	if n := mallocs(100, func() { w.wait() }); n != 0 {
		t.Fatalf("%d allocations in 100 waits", n)
	}
}

// A direct read, waiting included, allocates nothing: the buffer comes
// from the pool and goes back to it.
func TestDirectReadAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops a quarter of what is put back, so Get allocates")
	}
	peer, c := e2e.TCPPair(t)
	w := newWaiter(End{Conn: c})
	if !w.direct {
		t.Skip("no direct reads on this platform")
	}
	msg := []byte("x")
	once := func() {
		peer.Write(msg)
		bp, _, n, rerr, err := w.read(nil)
		if err != nil || rerr != nil || n != 1 {
			t.Fatalf("read: %d %v %v", n, rerr, err)
		}
		giveBack(bp)
	}
	if n := mallocs(100, once); n != 0 {
		t.Fatalf("%d allocations in 100 reads", n)
	}
}

// Relaying messages both ways allocates nothing (all goroutines counted):
// buffers come from the pool and go back to it.
func TestRelayAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	bothWays(t, relayAllocatesNothing)
}

func relayAllocatesNothing(t *testing.T, relay func(t testing.TB, client, upstream End) <-chan error) {
	clientPeer, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	done := relay(t, End{Conn: client}, End{Conn: upstream})
	q, a, buf := []byte("question"), []byte("answer"), make([]byte, 16)
	once := func() {
		clientPeer.Write(q)
		if _, err := io.ReadFull(nodePeer, buf[:len(q)]); err != nil {
			t.Fatal(err)
		}
		nodePeer.Write(a)
		if _, err := io.ReadFull(clientPeer, buf[:len(a)]); err != nil {
			t.Fatal(err)
		}
	}
	if n := mallocs(200, once); n != 0 {
		t.Errorf("%d allocations in 200 exchanges", n)
	}
	clientPeer.Close()
	nodePeer.Close()
	result(t, done)
}

// Idle relayed connections hold no buffer: their goroutines wait in the
// poller, not in a read, and the heap grows by far less than a buffer per
// connection.
func TestIdleHoldsNoBuffer(t *testing.T) {
	if raceEnabled {
		t.Skip("heap per connection is measured without the race detector (make test runs it so too)")
	}
	const conns = 200
	pairs, ends := idlePairs(t, conns)
	mid := gcStats()
	var wg sync.WaitGroup
	for _, e := range ends {
		wg.Add(1)
		go func() { defer wg.Done(); Pipe(e[0], e[1]) }()
	}
	pingPong(t, pairs)
	after := gcStats()
	perConn := (int64(after.HeapAlloc) - int64(mid.HeapAlloc)) / conns
	t.Logf("heap per idle relay: %d bytes", perConn)
	if perConn > BufferSize/4 {
		t.Errorf("an idle relay holds %d bytes of heap: a buffer is held", perConn)
	}
	stacks := make([]byte, 1<<22)
	stacks = stacks[:runtime.Stack(stacks, true)]
	// Sockets are read in the poller's callback (waiter.read), wrapped ones
	// peeked at (waiter.wait): either way the goroutine parks in the waiter.
	if n := bytes.Count(stacks, []byte("relay.(*waiter).read(")) + bytes.Count(stacks, []byte("relay.(*waiter).wait(")); n != 2*conns {
		t.Errorf("%d goroutines wait for readability, want %d", n, 2*conns)
	}
	for _, p := range pairs {
		p.clientPeer.Close()
		p.nodePeer.Close()
	}
	wg.Wait()
}

// gcStats collects twice (the second empties the pool's victim cache) and
// reads the memory statistics.
func gcStats() runtime.MemStats {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m
}

// A peerPair is the far ends of a relayed client and node connection.
type peerPair struct{ clientPeer, nodePeer net.Conn }

// idlePairs makes n client and node connection pairs, and the Ends a
// relay would take for each.
func idlePairs(t *testing.T, n int) ([]peerPair, [][2]End) {
	var pairs []peerPair
	var ends [][2]End
	for range n {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		pairs = append(pairs, peerPair{clientPeer, nodePeer})
		ends = append(ends, [2]End{{Conn: client}, {Conn: upstream}})
	}
	return pairs, ends
}

// pingPong sends one message each way through every pair's relay, so
// every direction has copied once.
func pingPong(t *testing.T, pairs []peerPair) {
	for _, p := range pairs {
		p.clientPeer.Write([]byte("ping"))
		p.nodePeer.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(p.nodePeer, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
		p.nodePeer.Write([]byte("pong"))
		p.clientPeer.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(p.clientPeer, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	}
}
