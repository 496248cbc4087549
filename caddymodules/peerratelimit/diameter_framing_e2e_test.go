package peerratelimit_test

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// splitUpstream is a raw Diameter upstream: it records every message it
// receives (bytes) and answers each request with 2001 — at once, one byte
// per write (split), or, with batched, all answers in one write once it has
// received want messages.
func splitUpstream(t *testing.T, split bool, want int) (string, func() [][]byte) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var got [][]byte
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		f := diameter.NewFramer(conn, 0, diameter.DefaultMaxLength)
		var batch []byte
		var in diameter.Info
		for {
			msg, err := f.Next()
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, append([]byte(nil), msg...))
			n := len(got)
			mu.Unlock()
			if in.Parse(msg) != nil || !in.Request {
				continue
			}
			ans, err := diameter.Refusal(in, 2001, "pcrf.example", "example", "")
			if err != nil {
				return
			}
			if !split {
				batch = append(batch, ans...)
				if n == want {
					conn.Write(batch)
				}
				continue
			}
			for i := range ans {
				if _, err := conn.Write(ans[i : i+1]); err != nil {
					return
				}
			}
		}
	}()
	return l.Addr().String(), func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// A Diameter stream split at every byte boundary (the client writes one
// byte per write, the upstream answers one byte per write) and the same
// stream with many messages per segment (one write each way) are framed
// identically through bin/caddy: the upstream receives the same admitted
// messages, byte for byte and in order; the client receives the same
// answers and refusals, each whole, and the same refusals for the same
// requests.
func TestDiameterSplitAndBatchedFramedIdentically(t *testing.T) {
	e2e.SkipShort(t)
	splitUp, splitSeen := splitUpstream(t, true, 0)
	// CER, then 12 credit-control requests: gx-ccr-i is limited to one
	// per 100 s (the first passes, the other three are refused), the
	// others are not limited; a DWR at the end.
	var reqs [][]byte
	add := func(cmd, app, typ, hbh uint32) {
		b, err := diameter.Request(cmd, app, typ, hbh, hbh, fmt.Sprintf("pgw1;%d", hbh), "pgw1.example", "example")
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, b)
	}
	add(diameter.CmdCapabilitiesExchange, 0, 0, 1)
	for i := range uint32(12) {
		add(diameter.CmdCreditControl, []uint32{diameter.AppGx, diameter.AppGy, diameter.AppGx}[i%3], 1+i%3, 100+i)
	}
	add(diameter.CmdDeviceWatchdog, 0, 0, 200)
	const refused = 3 // gx-ccr-i: i = 0, 3, 6, 9 (i%3 == 0): the first passes
	admitted := len(reqs) - refused
	batchUp, batchSeen := splitUpstream(t, false, admitted)

	split, batched := e2e.Addr(t), e2e.Addr(t)
	server := func(addr, name, up string) string {
		return diameterLimit(addr, name, "", `profile all {
						message gx-ccr-i {
							rate 0.01 1
						}
					}`, up)
	}
	e2e.StartCaddy(t, "caddyfile", "{\n\tlayer4 {"+server(split, "split", splitUp)+server(batched, "batched", batchUp)+"\n\t}\n}\n")

	// run sends the stream (a byte per write, or in one write) and reads
	// every answer; it returns them by Hop-by-Hop identifier.
	run := func(addr string, bytewise bool) map[uint32][]byte {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		all := bytes.Join(reqs, nil)
		go func() {
			if !bytewise {
				conn.Write(all)
				return
			}
			for i := range all {
				if _, err := conn.Write(all[i : i+1]); err != nil {
					return
				}
			}
		}()
		conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		f := diameter.NewFramer(conn, 0, diameter.DefaultMaxLength)
		out := map[uint32][]byte{}
		var in diameter.Info
		for len(out) < len(reqs) {
			msg, err := f.Next()
			if err != nil {
				t.Fatalf("after %d of %d answers: %v", len(out), len(reqs), err)
			}
			if err := in.Parse(msg); err != nil || in.Request {
				t.Fatalf("the client got a message that is not a whole answer (%v): %x", err, msg)
			}
			if _, dup := out[in.Header.HopByHopID]; dup {
				t.Fatalf("two answers to %d", in.Header.HopByHopID)
			}
			out[in.Header.HopByHopID] = append([]byte(nil), msg...)
		}
		if f.Buffered() != 0 {
			t.Errorf("%d bytes beyond the last answer", f.Buffered())
		}
		return out
	}
	gotSplit := run(split, true)
	gotBatched := run(batched, false)

	var tooBusy int
	for hbh, a := range gotSplit {
		b, ok := gotBatched[hbh]
		if !ok || !bytes.Equal(a, b) {
			t.Errorf("answer to %d: split %x, batched %x", hbh, a, b)
		}
		if a[4]&0x20 != 0 { // E bit: the proxy's refusal (3002)
			tooBusy++
		}
	}
	if tooBusy != refused {
		t.Errorf("%d refusals, want %d", tooBusy, refused)
	}
	var wantUp [][]byte
	for i, r := range reqs {
		if i >= 1 && i <= 12 && (i-1)%3 == 0 && i != 1 {
			continue // refused gx-ccr-i
		}
		wantUp = append(wantUp, r)
	}
	for what, seen := range map[string]func() [][]byte{"split": splitSeen, "batched": batchSeen} {
		got := seen()
		if len(got) != len(wantUp) {
			t.Errorf("%s: upstream received %d messages, want %d", what, len(got), len(wantUp))
			continue
		}
		for i := range got {
			if !bytes.Equal(got[i], wantUp[i]) {
				t.Errorf("%s: upstream message %d differs from the client's", what, i)
			}
		}
	}
}
