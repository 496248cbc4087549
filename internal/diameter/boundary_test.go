package diameter

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// The proxy's own answer waits for the upstream's message in progress to
// end, then goes out whole.
func TestBoundaryWriterNeverInterleaves(t *testing.T) {
	m := diam.NewRequest(272, 4, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("upstream;1"))
	up, _ := m.Serialize()
	own := []byte("OWN-ANSWER")
	var out bytes.Buffer
	b := &BoundaryWriter{W: &out}
	q := testPolicy(8, time.Minute)

	b.Write(up[:7]) // inside the header
	if _, err := b.Inject(own, q); err != nil {
		t.Fatal(err)
	}
	b.Write(up[7:30]) // inside the body
	if out.Len() != 30 {
		t.Fatalf("the answer was written mid-message: %q", out.Bytes())
	}
	b.Write(up[30:])
	if want := append(append([]byte(nil), up...), own...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("got %q", out.Bytes())
	}
	// At a boundary it goes out at once.
	b.Inject(own, q)
	if !bytes.HasSuffix(out.Bytes(), append(own, own...)) {
		t.Fatal("not written at a boundary")
	}
	// A write that ends one message and starts the next: the answer waits
	// for the next boundary, never goes inside either.
	out.Reset()
	b.Write(up[:3])
	b.Inject(own, q)
	b.Write(append(up[3:], up[:9]...))
	if out.Len() != len(up)+9 {
		t.Fatalf("written inside the second message: %q", out.Bytes())
	}
	b.Write(up[9:])
	if want := append(append(append([]byte(nil), up...), up...), own...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("two messages: %q", out.Bytes())
	}
}

// counter is a Counter for tests.
type counter struct{ n atomic.Int64 }

func (c *counter) Add(v float64) { c.n.Add(int64(v)) }

func value(c Counter) float64 { return float64(c.(*counter).n.Load()) }

func testPolicy(max int, wait time.Duration) QueuePolicy {
	return QueuePolicy{Max: max, Wait: wait, Full: &counter{}, Stalled: &counter{}}
}

// Refusals waiting for a boundary are bounded: past the limit they are
// discarded and counted (and the first overflow reported); the ones that
// fit go out whole at the next boundary.
func TestBoundaryWriterQueueIsBounded(t *testing.T) {
	up := make([]byte, 40)
	up[0], up[3] = 1, 40 // version 1, length 40
	var out bytes.Buffer
	var overflows atomic.Int64
	b := &BoundaryWriter{W: &out, Overflow: func() { overflows.Add(1) }}
	q := testPolicy(3, time.Minute)
	b.Write(up[:25])
	discarded := 0
	for range 10 {
		if d, err := b.Inject([]byte("OWN!"), q); err != nil {
			t.Fatal(err)
		} else if d {
			discarded++
		}
	}
	if discarded != 7 || value(q.Full) != 7 || overflows.Load() != 1 {
		t.Fatalf("%d discarded, counter %v, %d overflow reports; want 7, 7, 1", discarded, value(q.Full), overflows.Load())
	}
	b.Write(up[25:])
	if want := string(up) + "OWN!OWN!OWN!"; out.String() != want {
		t.Fatalf("wrote %q", out.Bytes())
	}
}

// A refusal that waits longer than the policy's wait for the upstream's
// message to end ends the connection: the waiting refusals are discarded
// and counted, later ones too; a queue flushed in time does not.
func TestBoundaryWriterStall(t *testing.T) {
	up := make([]byte, 40)
	up[0], up[3] = 1, 40
	var out bytes.Buffer
	stalls := make(chan int, 2)
	b := &BoundaryWriter{W: &out, Stall: func(n int, _ time.Duration) { stalls <- n }}
	q := testPolicy(8, 50*time.Millisecond)

	// Flushed in time: no stall, even after the wait has passed.
	b.Write(up[:10])
	b.Inject([]byte("OWN!"), q)
	b.Write(up[10:])
	time.Sleep(100 * time.Millisecond) // past the wait of the flushed episode
	select {
	case n := <-stalls:
		t.Fatalf("a flushed queue stalled (%d)", n)
	default:
	}

	b.Write(up[:10])
	b.Inject([]byte("OWN!"), q)
	b.Inject([]byte("OWN!"), q)
	select {
	case n := <-stalls:
		if n != 2 || value(q.Stalled) != 2 {
			t.Fatalf("stall discarded %d, counted %v; want 2", n, value(q.Stalled))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stall")
	}
	if d, _ := b.Inject([]byte("OWN!"), q); !d || value(q.Stalled) != 3 {
		t.Fatal("a refusal after the stall was not discarded")
	}
	b.Write(up[10:])
	if want := string(up) + "OWN!" + string(up); out.String() != want {
		t.Fatalf("wrote %q", out.Bytes())
	}
}
