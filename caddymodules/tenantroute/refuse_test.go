package tenantroute

import (
	"bytes"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

// recorder is a net.Conn that keeps what is written to it.
type recorder struct {
	net.Conn // nil: only Write is used
	mu       sync.Mutex
	out      bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(b)
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.out.Bytes())
}

// A refused bind goes nowhere: the client's stream, cut into random reads
// as the relay feeds it, reaches the node without the binds Admit refused,
// with everything else in order.
func TestRefusedBindsAreLeftOut(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 1))
	var stream, want []byte
	for id := int64(1); id <= 60; id++ {
		var m []byte
		if id%3 == 0 {
			m = bindMsg(id, "uid=alice,o=acme,dc=example")
		} else {
			m = searchMsg(id, "(cn="+strings.Repeat("x", r.IntN(300))+")")
		}
		stream = append(stream, m...)
		if id%6 != 0 { // binds with an even ID are refused
			want = append(want, m...)
		}
	}
	node := &recorder{}
	g := &ldapwire.TenantGuard{Tenant: "acme", MaxLen: 1 << 16}
	g.Admit = func(id int64) error {
		if id%2 == 0 {
			return ldapwire.ErrRefused
		}
		return nil
	}
	to := &nodeConn{wrapped: wrapped{Conn: node}, guard: g}
	var held []byte
	for len(stream) > 0 {
		k := min(len(stream), 1+r.IntN(200))
		held = append(held, stream[:k]...)
		stream = stream[k:]
		n, err := g.Feed(held)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			to.Write(held[:n])
		}
		held = held[n:]
	}
	if got := node.bytes(); len(held) > 0 || !bytes.Equal(got, want) {
		t.Fatalf("the node got %d bytes, want %d (%d held)", len(got), len(want), len(held))
	}
}

// The router's answers reach the client between the node's messages: an
// answer given while a node's message is half written waits for its end,
// one given between messages is written at once, and answers given from
// another goroutine while the node's stream is written in random pieces
// never land inside a message.
func TestAnswersGoBetweenMessages(t *testing.T) {
	answer := ldapwire.BindResponse(99, ldapwire.ResultBusy, busyMessage)
	msg := searchMsg(1, "(cn="+strings.Repeat("y", 500)+")")
	client := &recorder{}
	w := &ldapwire.BindWatcher{OnBind: func(int64) error { return nil }, MaxLen: 1 << 16}
	c := &clientConn{wrapped: wrapped{Conn: client}, watcher: w}
	var held []byte // what the watcher held back, fed again with what follows (as the relay does)
	feed := func(b []byte) {
		held = append(held, b...)
		n, err := w.Feed(held)
		if err != nil {
			t.Fatalf("watcher: %v", err)
		}
		if n > 0 {
			c.Write(held[:n])
		}
		held = held[n:]
	}
	feed(msg[:100])
	if err := c.answer(answer); err != nil {
		t.Fatal(err)
	}
	if got := client.bytes(); len(got) != 100 {
		t.Fatalf("an answer inside a node's message was written: %d bytes", len(got))
	}
	feed(msg[100:])
	if got := client.bytes(); !bytes.Equal(got, append(bytes.Clone(msg), answer...)) {
		t.Fatalf("after the message: %d bytes, want the message then the answer", len(got))
	}
	c.answer(answer)
	if got := client.bytes(); len(got) != len(msg)+2*len(answer) {
		t.Fatalf("an answer between messages waited: %d bytes", len(got))
	}

	// Concurrent: 40 node messages in random pieces, 15 answers (a client may have at most
	// maxAnswersQueued waiting).
	client.out.Reset()
	r := rand.New(rand.NewPCG(33, 2))
	var stream []byte
	for i := range 40 {
		stream = append(stream, searchMsg(int64(i+2), "(cn="+strings.Repeat("z", r.IntN(2000))+")")...)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 15 {
			if err := c.answer(answer); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for rest := stream; len(rest) > 0; {
		k := min(len(rest), 1+r.IntN(700))
		feed(rest[:k])
		rest = rest[k:]
	}
	wg.Wait()
	got := client.bytes()
	answers := 0
	for len(got) > 0 {
		m, err := ldapwire.Read(bytes.NewReader(got), 1<<16)
		if err != nil {
			t.Fatalf("the client's stream is not whole messages: %v", err)
		}
		if bytes.Equal(m.Raw, answer) {
			answers++
		}
		got = got[len(m.Raw):]
	}
	if answers != 15 || len(held) > 0 {
		t.Fatalf("%d answers reached the client, want 15 (%d bytes held)", answers, len(held))
	}
}
