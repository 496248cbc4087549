package peerratelimit

import (
	"bytes"
	"testing"

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

	b.Write(up[:7]) // inside the header
	if err := b.inject(own); err != nil {
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
	b.inject(own)
	if !bytes.HasSuffix(out.Bytes(), append(own, own...)) {
		t.Fatal("not written at a boundary")
	}
	// A write that ends one message and starts the next: the answer waits
	// for the next boundary, never goes inside either.
	out.Reset()
	b.Write(up[:3])
	b.inject(own)
	b.Write(append(up[3:], up[:9]...))
	if out.Len() != len(up)+9 {
		t.Fatalf("written inside the second message: %q", out.Bytes())
	}
	b.Write(up[9:])
	if want := append(append(append([]byte(nil), up...), up...), own...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("two messages: %q", out.Bytes())
	}
}
