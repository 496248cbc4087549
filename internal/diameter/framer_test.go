package diameter

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// stream is a peer's stream of varied messages: a CER, credit-control
// requests of every type, a DWR, answers, a header-only message and one
// larger than the small framer buffer used below.
func stream(t testing.TB) (all []byte, msgs [][]byte) {
	add := func(b []byte, err error) {
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, b)
		all = append(all, b...)
	}
	add(Request(CmdCapabilitiesExchange, 0, 0, 1, 1, "", "pgw1.example", "example"))
	for i := range uint32(8) {
		add(Request(CmdCreditControl, []uint32{AppGx, AppGy}[i%2], 1+i%4, 10+i, 10+i, fmt.Sprintf("pgw1;%d", i), "pgw1.example", "example"))
	}
	add(Request(CmdDeviceWatchdog, 0, 0, 30, 30, "", "pgw1.example", "example"))
	big := diam.NewRequest(CmdCreditControl, AppGx, dict.Default)
	big.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("pgw1;big"))
	big.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pgw1.example"))
	big.NewAVP(avp.UserName, avp.Mbit, 0, datatype.UTF8String(bytes.Repeat([]byte("x"), 700)))
	add(big.Serialize())
	a := diam.NewMessage(CmdCreditControl, 0, AppGx, 11, 11, dict.Default)
	a.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(2001))
	add(a.Serialize())
	add([]byte{1, 0, 0, 20, 0x80, 0, 1, 24, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0, 0, 40}, nil) // DWR, header only
	return all, msgs
}

// segments reads the given segments one per Read.
type segments struct{ segs [][]byte }

func (s *segments) Read(p []byte) (int, error) {
	for len(s.segs) > 0 && len(s.segs[0]) == 0 {
		s.segs = s.segs[1:]
	}
	if len(s.segs) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.segs[0])
	s.segs[0] = s.segs[0][n:]
	return n, nil
}

// cut splits b at the given offsets.
func cut(b []byte, at ...int) [][]byte {
	var out [][]byte
	last := 0
	for _, k := range at {
		out = append(out, b[last:k])
		last = k
	}
	return append(out, b[last:])
}

type framed struct {
	msg  []byte
	info Info
	typ  string
}

// frame runs segs through a Framer with a buffer of size and parses each
// message; it returns what it framed (copies) and the final error.
func frame(t *testing.T, segs [][]byte, size int) ([]framed, error) {
	f := NewFramer(&segments{segs: segs}, size, DefaultMaxLength)
	var out []framed
	var in Info
	for {
		msg, err := f.Next()
		if err != nil {
			return out, err
		}
		if err := in.Parse(msg); err != nil {
			t.Fatalf("parse: %v", err)
		}
		cp := in
		h := *in.Header
		cp.Header, cp.SessionID, cp.SessionIDRaw = &h, string(in.SessionIDRaw), nil
		out = append(out, framed{msg: append([]byte(nil), msg...), info: cp, typ: in.Type()})
	}
}

// Client to upstream: the stream framed from one segment, from one segment
// per byte, and split in two at every byte boundary gives the same
// messages, each classified as Classify does, whatever the buffer size
// (one smaller than a message takes the large-message path).
func TestFramerSplitAtEveryByteAndBatched(t *testing.T) {
	all, msgs := stream(t)
	var want []framed
	for _, m := range msgs {
		h, err := ParseHeader(m, DefaultMaxLength)
		if err != nil {
			t.Fatal(err)
		}
		in, err := Classify(m, h)
		if err != nil {
			t.Fatal(err)
		}
		in.SessionIDRaw = nil
		want = append(want, framed{msg: m, info: in, typ: in.Type()})
	}
	check := func(what string, got []framed, err error) {
		t.Helper()
		if err != io.EOF {
			t.Fatalf("%s: ended with %v, want io.EOF", what, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: framed %d messages differently from the %d sent", what, len(got), len(want))
		}
	}
	for _, size := range []int{0, 256} {
		got, err := frame(t, [][]byte{append([]byte(nil), all...)}, size)
		check(fmt.Sprintf("one segment (buffer %d)", size), got, err)
		var bytewise [][]byte
		for i := range all {
			bytewise = append(bytewise, all[i:i+1])
		}
		got, err = frame(t, bytewise, size)
		check(fmt.Sprintf("a segment per byte (buffer %d)", size), got, err)
		for k := 1; k < len(all); k++ {
			got, err = frame(t, cut(append([]byte(nil), all...), k), size)
			check(fmt.Sprintf("split at byte %d (buffer %d)", k, size), got, err)
		}
	}
	// A stream that ends inside a message is malformed, at every cut.
	for k := 1; k < len(msgs[0]); k++ {
		if _, err := frame(t, [][]byte{all[:k]}, 0); err == io.EOF || err == nil {
			t.Fatalf("stream cut at %d: %v, want malformed", k, err)
		}
	}
}

// Upstream to client: the upstream's stream written split at every byte
// boundary, a byte per write, or all in one write, with a refusal
// injected after every write, reaches the client as the same upstream
// messages with every refusal whole between them.
func TestBoundaryWriterSplitAtEveryByteAndBatched(t *testing.T) {
	all, msgs := stream(t)
	own, err := Refusal(Info{Header: &diam.Header{CommandCode: CmdCreditControl, ApplicationID: AppGx, HopByHopID: 99, EndToEndID: 99}, Request: true, SessionID: "own"},
		ResultUnableToDeliver, "dra.example", "example", "rate limit exceeded")
	if err != nil {
		t.Fatal(err)
	}
	run := func(what string, writes [][]byte) {
		t.Helper()
		var out bytes.Buffer
		b := &BoundaryWriter{W: &out}
		q := QueuePolicy{Max: 1 << 20, Wait: time.Hour, Full: &counter{}, Stalled: &counter{}}
		injected := 0
		for _, w := range writes {
			if _, err := b.Write(w); err != nil {
				t.Fatal(err)
			}
			if d, err := b.Inject(own, q); err != nil || d {
				t.Fatalf("%s: inject: discarded %v, %v", what, d, err)
			}
			injected++
		}
		got, err := frame(t, [][]byte{out.Bytes()}, 0)
		if err != io.EOF {
			t.Fatalf("%s: the client's stream does not frame: %v", what, err)
		}
		var up [][]byte
		owns := 0
		for _, g := range got {
			if bytes.Equal(g.msg, own) {
				owns++
				continue
			}
			up = append(up, g.msg)
		}
		if owns != injected || !reflect.DeepEqual(up, msgs) {
			t.Fatalf("%s: %d refusals of %d injected, %d upstream messages of %d", what, owns, injected, len(up), len(msgs))
		}
	}
	run("one write", [][]byte{all})
	var bytewise [][]byte
	for i := range all {
		bytewise = append(bytewise, all[i:i+1])
	}
	run("a write per byte", bytewise)
	for k := 1; k < len(all); k++ {
		run(fmt.Sprintf("split at byte %d", k), cut(all, k))
	}
}

// Framing and deciding a connection's messages allocates nothing. Each
// count is over one run of many operations: AllocsPerRun's average over
// a single run is the exact total, where over as many runs as operations
// it would round anything under one allocation per operation down to 0.
func TestFramerParseAllocatesNothing(t *testing.T) {
	all, msgs := stream(t)
	msg := msgs[1] // a Gx CCR-I
	var in Info
	src := &repeat{b: msg}
	f := NewFramer(src, 0, DefaultMaxLength)
	allocs := testing.AllocsPerRun(1, func() {
		for range 1000 {
			m, err := f.Next()
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Parse(m); err != nil {
				t.Fatal(err)
			}
			_ = in.Type()
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations in 1000 messages, want 0", allocs)
	}
	var sink bytes.Buffer
	b := &BoundaryWriter{W: &sink}
	allocs = testing.AllocsPerRun(1, func() {
		for range 100 {
			sink.Reset()
			b.Write(all)
		}
	})
	if allocs != 0 {
		t.Errorf("boundary writer: %v allocations in 100 writes, want 0", allocs)
	}
}

// repeat reads b again and again, many copies per Read.
type repeat struct {
	b   []byte
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := copy(p[n:], r.b[r.off:])
		n += k
		r.off = (r.off + k) % len(r.b)
	}
	return n, nil
}

// The per-message cost of the Diameter path against a plain relay in the
// same run: a client's stream of Gx CCR-U requests copied to the upstream
// (io.CopyBuffer, what a plain layer-4 proxy does), against framed,
// parsed, typed and copied through the framer in the same 32 KiB writes,
// and the upstream's answers through the boundary writer against a plain
// write. Messages per op: b.N.
func BenchmarkRelay(b *testing.B) {
	msg, err := Request(CmdCreditControl, AppGx, 2, 1, 1, "load;2", "pgw1.example", "example")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("plain", func(b *testing.B) {
		src := io.LimitReader(&repeat{b: msg}, int64(b.N*len(msg)))
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		buf := make([]byte, 32*1024)
		if _, err := io.CopyBuffer(io.Discard, readerOnly{src}, buf); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("framed", func(b *testing.B) {
		src := io.LimitReader(&repeat{b: msg}, int64(b.N*len(msg)))
		f := NewFramer(src, 0, DefaultMaxLength)
		var in Info
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		out := make([]byte, 0, 32*1024)
		for range b.N {
			m, err := f.Next()
			if err != nil {
				b.Fatal(err)
			}
			if err := in.Parse(m); err != nil {
				b.Fatal(err)
			}
			if in.Type() != "gx-ccr-u" {
				b.Fatal(in.Type())
			}
			if len(out)+len(m) > cap(out) {
				io.Discard.Write(out)
				out = out[:0]
			}
			out = append(out, m...)
		}
	})
	answers := bytes.Repeat(msg, 32*1024/len(msg))
	b.Run("plain-answers", func(b *testing.B) {
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		w := io.Discard
		for i := 0; i < b.N; i += len(answers) / len(msg) {
			w.Write(answers)
		}
	})
	b.Run("boundary-answers", func(b *testing.B) {
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		w := &BoundaryWriter{W: io.Discard}
		for i := 0; i < b.N; i += len(answers) / len(msg) {
			w.Write(answers)
		}
	})
}

// readerOnly hides a reader's WriterTo, as a proxied net.Conn would.
type readerOnly struct{ io.Reader }
