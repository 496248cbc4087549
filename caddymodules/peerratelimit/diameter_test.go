package peerratelimit

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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
	b := &boundaryWriter{w: &out}
	q := testPolicy(8, time.Minute)

	b.Write(up[:7]) // inside the header
	if _, err := b.inject(own, q); err != nil {
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
	b.inject(own, q)
	if !bytes.HasSuffix(out.Bytes(), append(own, own...)) {
		t.Fatal("not written at a boundary")
	}
	// A write that ends one message and starts the next: the answer waits
	// for the next boundary, never goes inside either.
	out.Reset()
	b.Write(up[:3])
	b.inject(own, q)
	b.Write(append(up[3:], up[:9]...))
	if out.Len() != len(up)+9 {
		t.Fatalf("written inside the second message: %q", out.Bytes())
	}
	b.Write(up[9:])
	if want := append(append(append([]byte(nil), up...), up...), own...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("two messages: %q", out.Bytes())
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

func testPolicy(max int, wait time.Duration) queuePolicy {
	return queuePolicy{max: max, wait: wait,
		full:    prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}),
		stalled: prometheus.NewCounter(prometheus.CounterOpts{Name: "stalled"})}
}

// Refusals waiting for a boundary are bounded: past the limit they are
// discarded and counted (and the first overflow reported); the ones that
// fit go out whole at the next boundary.
func TestBoundaryWriterQueueIsBounded(t *testing.T) {
	up := make([]byte, 40)
	up[0], up[3] = 1, 40 // version 1, length 40
	var out bytes.Buffer
	var overflows atomic.Int64
	b := &boundaryWriter{w: &out, overflow: func() { overflows.Add(1) }}
	q := testPolicy(3, time.Minute)
	b.Write(up[:25])
	discarded := 0
	for range 10 {
		if d, err := b.inject([]byte("OWN!"), q); err != nil {
			t.Fatal(err)
		} else if d {
			discarded++
		}
	}
	if discarded != 7 || value(q.full) != 7 || overflows.Load() != 1 {
		t.Fatalf("%d discarded, counter %v, %d overflow reports; want 7, 7, 1", discarded, value(q.full), overflows.Load())
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
	b := &boundaryWriter{w: &out, stall: func(n int, _ time.Duration) { stalls <- n }}
	q := testPolicy(8, 50*time.Millisecond)

	// Flushed in time: no stall, even after the wait has passed.
	b.Write(up[:10])
	b.inject([]byte("OWN!"), q)
	b.Write(up[10:])
	time.Sleep(100 * time.Millisecond) // past the wait of the flushed episode
	select {
	case n := <-stalls:
		t.Fatalf("a flushed queue stalled (%d)", n)
	default:
	}

	b.Write(up[:10])
	b.inject([]byte("OWN!"), q)
	b.inject([]byte("OWN!"), q)
	select {
	case n := <-stalls:
		if n != 2 || value(q.stalled) != 2 {
			t.Fatalf("stall discarded %d, counted %v; want 2", n, value(q.stalled))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stall")
	}
	if d, _ := b.inject([]byte("OWN!"), q); !d || value(q.stalled) != 3 {
		t.Fatal("a refusal after the stall was not discarded")
	}
	b.Write(up[10:])
	if want := string(up) + "OWN!" + string(up); out.String() != want {
		t.Fatalf("wrote %q", out.Bytes())
	}
}
