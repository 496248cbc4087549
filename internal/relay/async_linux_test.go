package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Start takes only bare sockets: a wrapper, read-ahead bytes or a
// connection without a socket are left to Pipe, and nothing is done.
func TestStartRefusesWhatItCannotWatch(t *testing.T) {
	_, client := e2e.TCPPair(t)
	upstream, _ := e2e.TCPPair(t)
	pipeEnd, _ := net.Pipe()
	called := false
	done := func(error) { called = true }
	for name, ends := range map[string][2]End{
		"net.Pipe": {{Conn: pipeEnd}, {Conn: upstream}},
		"wrapper":  {{Conn: &prefetched{Conn: client}, Socket: client}, {Conn: upstream}},
		"buffered": {{Conn: client, Buffered: func() int { return 0 }}, {Conn: upstream}},
	} {
		if Start(ends[0], ends[1], done) {
			t.Errorf("%s: Start took it", name)
		}
	}
	if called {
		t.Error("done was called")
	}
}

// Idle connections relayed by Start hold no goroutine and no buffer:
// after one exchange each way, no flow is running, and the heap grows by
// far less than a buffer per connection.
func TestStartIdleHoldsNoGoroutine(t *testing.T) {
	if raceEnabled {
		t.Skip("heap per connection is measured without the race detector (make test runs it so too)")
	}
	const conns = 200
	pairs, ends := idlePairs(t, conns)
	pickSet() // the epoll sets, their goroutines and tables are not per connection
	mid := gcStats()
	goroutines := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for _, e := range ends {
		wg.Add(1)
		if !Start(e[0], e[1], func(error) { wg.Done() }) {
			t.Skip("Start is not available here")
		}
	}
	pingPong(t, pairs)
	// A flow's goroutine ends once its direction has been silent for
	// Linger: wait for them.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine() - goroutines; n > 0 {
		stacks := make([]byte, 1<<20)
		t.Fatalf("%d goroutines more than before %d idle relays:\n%s", n, conns, stacks[:runtime.Stack(stacks, true)])
	}
	after := gcStats()
	perConn := (int64(after.HeapAlloc) - int64(mid.HeapAlloc)) / conns
	t.Logf("heap per idle relay: %d bytes", perConn)
	if perConn > BufferSize/8 {
		t.Errorf("an idle relay holds %d bytes of heap", perConn)
	}
	for _, p := range pairs {
		p.clientPeer.Close()
		p.nodePeer.Close()
	}
	wg.Wait()
}

// Many connections relaying at once, both ways, messages of every size up
// to several buffers, through a Filter that holds split messages, with
// readers slower than the writers (writes block): every byte arrives, in
// order, on its own connection, and every relay ends with done.
func TestStartConcurrentBurst(t *testing.T) {
	conns, msgs := 64, 40
	if testing.Short() || raceEnabled {
		conns, msgs = 16, 20
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*conns)
	for c := range conns {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		var stream [2][]byte
		rng := rand.New(rand.NewPCG(uint64(c), 1))
		for dir := range stream {
			for range msgs {
				size := rng.IntN(3 * BufferSize)
				stream[dir] = append(stream[dir], frame(strings.Repeat(string(rune('a'+c%26)), size))...)
			}
		}
		wg.Add(1)
		if !Start(End{Conn: client, Filter: &lengthFramed{}}, End{Conn: upstream, Filter: &lengthFramed{}},
			func(err error) {
				if err != nil {
					errs <- err
				}
				client.Close()
				upstream.Close()
				wg.Done()
			}) {
			t.Skip("Start is not available here")
		}
		send := func(w *net.TCPConn, b []byte, seed uint64) {
			rng := rand.New(rand.NewPCG(seed, 2)) // its own: senders run at once
			for len(b) > 0 {
				n := min(len(b), 1+rng.IntN(20000))
				if _, err := w.Write(b[:n]); err != nil {
					errs <- err
					return
				}
				b = b[n:]
			}
			w.CloseWrite()
		}
		check := func(r net.Conn, want []byte) {
			defer wg.Done()
			r.SetReadDeadline(time.Now().Add(60 * time.Second))
			var got bytes.Buffer
			buf := make([]byte, 4096) // small reads: the relay's writes block
			for {
				n, err := r.Read(buf)
				got.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
			}
			if !bytes.Equal(got.Bytes(), want) {
				errs <- io.ErrShortWrite
			}
		}
		wg.Add(2)
		go send(clientPeer, stream[0], uint64(2*c))
		go send(nodePeer, stream[1], uint64(2*c+1))
		go check(nodePeer, stream[0])
		go check(clientPeer, stream[1])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Bytes already waiting on both sockets when Start is called are relayed:
// the events that came while Start was adding the sockets are served.
func TestStartBytesAlreadyWaiting(t *testing.T) {
	clientPeer, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	clientPeer.Write([]byte("question"))
	nodePeer.Write([]byte("greeting"))
	// Loopback TCP queues the bytes at the receiver before Write returns.
	done := started(t, End{Conn: client}, End{Conn: upstream})
	clientPeer.CloseWrite()
	nodePeer.CloseWrite()
	if got := readAll(t, nodePeer); string(got) != "question" {
		t.Fatalf("node got %q", got)
	}
	if got := readAll(t, clientPeer); string(got) != "greeting" {
		t.Fatalf("client got %q", got)
	}
	if err := result(t, done); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

// Every relay ends, once, whatever its peers do and when: half-closes,
// resets and closes on either side, in the middle of traffic both ways,
// 100 relays at once. done is called exactly once for each, and no
// goroutine nor epoll set entry is left behind. Run as configured, with
// directions parked after a millisecond of silence (so that many end
// while parked), and so again with each park held a millisecond between
// joining the set and turning idle (so that many end while joining it:
// TestStartEndsWhenTheOtherDirectionFailsWhileParking forces that case).
func TestStartEndsWhateverThePeersDo(t *testing.T) {
	t.Run("default", startEndsWhateverThePeersDo)
	prime, linger := Prime, Linger
	Prime, Linger = time.Millisecond, time.Millisecond
	defer func() { Prime, Linger = prime, linger }()
	t.Run("parking often", startEndsWhateverThePeersDo)
	parkHook = func(*flow) { time.Sleep(time.Millisecond) }
	defer func() { parkHook = nil }() // the subtest waits until no flow goroutine is left
	t.Run("joining slowly", startEndsWhateverThePeersDo)
}

func startEndsWhateverThePeersDo(t *testing.T) {
	before := runtime.NumGoroutine()
	const relays = 100
	var wg sync.WaitGroup
	calls := make([]int32, relays)
	var mu sync.Mutex
	for i := range relays {
		clientPeer, client := e2e.TCPPair(t)
		upstream, nodePeer := e2e.TCPPair(t)
		wg.Add(1)
		if !Start(End{Conn: client, Filter: &lengthFramed{}}, End{Conn: upstream}, func(error) {
			mu.Lock()
			calls[i]++
			mu.Unlock()
			client.Close()
			upstream.Close()
			wg.Done()
		}) {
			t.Skip("Start is not available here")
		}
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		msgs, how := rng.IntN(20), rng.IntN(5)
		go func() {
			for range msgs {
				if _, err := clientPeer.Write(frame(strings.Repeat("q", rng.IntN(3*BufferSize)))); err != nil {
					break
				}
			}
			switch how {
			case 0: // both half-close, then drain
				clientPeer.CloseWrite()
				nodePeer.CloseWrite()
			case 1: // the node resets
				nodePeer.SetLinger(0)
				nodePeer.Close()
			case 2: // the client resets
				clientPeer.SetLinger(0)
				clientPeer.Close()
			case 3: // the client closes
				clientPeer.Close()
				nodePeer.CloseWrite()
			case 4: // a refused message, then more
				clientPeer.Write(frame("evil"))
				clientPeer.Write(frame("after"))
			}
		}()
		go io.Copy(io.Discard, nodePeer) // the node reads all; its close or reset ends this
		go io.Copy(io.Discard, clientPeer)
		go func() { nodePeer.Write(frame("greeting")) }()
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(60 * time.Second):
		t.Fatal("some relays never ended")
	}
	for i, n := range calls {
		if n != 1 {
			t.Errorf("relay %d: done called %d times", i, n)
		}
	}
	// The test's own readers end with their connections (closed by the
	// cleanups); the relays' goroutines must be gone already.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		stacks := make([]byte, 1<<20)
		stacks = stacks[:runtime.Stack(stacks, true)]
		if !bytes.Contains(stacks, []byte("relay.(*flow)")) {
			if n := watched(); n > 0 {
				t.Errorf("%d sockets still in the epoll sets' tables", n)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("flow goroutines left after every relay ended (%d goroutines before, %d now)", before, runtime.NumGoroutine())
}

// A relay ends when its other direction fails while a direction is
// joining the epoll set: the socket is in the set, the flow not yet idle,
// and the failure takes the sockets out of the set and closes them, so no
// event will ever wake the flow again. The hook holds the client's
// direction in that window until the node's reset has failed the pipe;
// only park's check of the failure afterwards can end the flow (and the
// relay: without it done is never called).
func TestStartEndsWhenTheOtherDirectionFailsWhileParking(t *testing.T) {
	_, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	var held atomic.Pointer[flow]
	var failedInWindow atomic.Bool
	parkHook = func(f *flow) {
		if f.src.Conn != client || !held.CompareAndSwap(nil, f) {
			return
		}
		nodePeer.SetLinger(0)
		nodePeer.Close() // RST: the node's direction fails the pipe
		for deadline := time.Now().Add(10 * time.Second); !f.ap.failed.Load() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		failedInWindow.Store(f.ap.failed.Load() && f.state.Load() == running)
	}
	t.Cleanup(func() { parkHook = nil })                       // after done: every flow of the relay has passed the hook
	done := started(t, End{Conn: client}, End{Conn: upstream}) // silent: both directions park after Prime
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("relay: %v, want the node's reset", err)
		}
	case <-time.After(10*time.Second + 2*Prime):
		t.Fatal("the relay never ended: its client direction was failed while joining the epoll set and stays idle")
	}
	if !failedInWindow.Load() {
		t.Fatal("the pipe did not fail while the client's direction was between joining the set and turning idle")
	}
	if f := held.Load(); f.state.Load() != ended {
		t.Errorf("the client's direction is in state %d, want ended", f.state.Load())
	}
}

// watched counts the flows in the epoll sets' tables.
func watched() int {
	n := 0
	for _, s := range sets {
		s.mu.Lock()
		for _, f := range s.tab {
			if f != nil {
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Own's connection outlives the original descriptor: Start relays it
// both ways after the original is closed (at once, and after it has
// parked in the epoll set), passes an EOF on as a half-close, and
// reports a reset.
func TestOwnOutlivesTheOriginal(t *testing.T) {
	for _, pause := range []time.Duration{0, 3 * Prime} {
		t.Run(fmt.Sprintf("half-close after %v", pause), func(t *testing.T) {
			clientPeer, nodePeer, done := ownedAndStarted(t)
			time.Sleep(pause)
			clientPeer.Write([]byte("question"))
			clientPeer.CloseWrite()
			if got := readAll(t, nodePeer); string(got) != "question" {
				t.Fatalf("node got %q", got)
			}
			nodePeer.Write([]byte("answer"))
			nodePeer.CloseWrite()
			if got := readAll(t, clientPeer); string(got) != "answer" {
				t.Fatalf("client got %q", got)
			}
			if err := result(t, done); err != nil {
				t.Fatalf("relay: %v", err)
			}
		})
	}
	t.Run("reset", func(t *testing.T) {
		clientPeer, _, done := ownedAndStarted(t)
		clientPeer.SetLinger(0)
		clientPeer.Close() // RST
		if err := result(t, done); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("relay after a reset: %v", err)
		}
	})
}

// ownedAndStarted relays, with Start, Own's connection on a client's
// socket (the original closed) and a connection to a node; it returns
// the client's and the node's ends.
func ownedAndStarted(t *testing.T) (clientPeer, nodePeer *net.TCPConn, done <-chan error) {
	clientPeer, client := e2e.TCPPair(t)
	upstream, nodePeer := e2e.TCPPair(t)
	own, err := Own(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	client.Close()
	return clientPeer, nodePeer, started(t, End{Conn: own}, End{Conn: upstream})
}

// What Own costs against the standard library's way to a second
// connection on a socket (File, then FileConn).
func BenchmarkOwn(b *testing.B) {
	_, c := e2e.TCPPair(b)
	b.Run("anchor_file_fileconn", func(b *testing.B) {
		for b.Loop() {
			f, err := c.File()
			if err != nil {
				b.Fatal(err)
			}
			nc, err := net.FileConn(f)
			f.Close()
			if err != nil {
				b.Fatal(err)
			}
			nc.Close()
		}
	})
	b.Run("own", func(b *testing.B) {
		for b.Loop() {
			nc, err := Own(c)
			if err != nil {
				b.Fatal(err)
			}
			nc.Close()
		}
	})
}
