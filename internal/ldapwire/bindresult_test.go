package ldapwire

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"
)

// searchEntry is a SearchResultEntry of about size bytes, from a node.
func searchEntry(id int64, size int) []byte {
	e := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationSearchResultEntry, nil, "entry")
	e.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, strings.Repeat("x", size), "dn"))
	e.AppendChild(ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "attributes"))
	return envelope(id, e)
}

// BindResponse encodes what go-ldap decodes, and BindResult reads it back.
func TestBindResponseRoundTrip(t *testing.T) {
	for _, code := range []int64{0, 49, 51, 14} {
		b := BindResponse(7, code, "why")
		if got, ok := BindResult(b); !ok || got != code {
			t.Fatalf("code %d: BindResult %d %v", code, got, ok)
		}
		p, err := ber.DecodePacketErr(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := ldap.GetLDAPError(p); code != 0 && !ldap.IsErrorWithCode(err, uint16(code)) {
			t.Fatalf("go-ldap reads %v for code %d", err, code)
		}
	}
	for _, bad := range [][]byte{nil, {0x30}, bindRequest(1, "o=acme", "pw"), NoticeOfDisconnection(52, "x")} {
		if _, ok := BindResult(bad); ok {
			t.Fatalf("BindResult accepted % x", bad)
		}
	}
}

// The watcher sees every BindResponse whole, whatever the pieces the
// stream arrives in, passes every byte through unchanged, and lets large
// other messages pass in pieces.
func TestBindWatcher(t *testing.T) {
	stream := slices.Concat(BindResponse(1, 49, "invalid credentials"), searchEntry(2, 100_000),
		BindResponse(3, 0, ""), searchEntry(4, 10), BindResponse(5, 51, "busy"))
	for _, piece := range []int{1, 3, 7, 1000, len(stream)} {
		var codes []int64
		w := &BindWatcher{MaxLen: 1024, OnBind: func(c int64) error { codes = append(codes, c); return nil }}
		var out, held []byte
		for i := 0; i < len(stream); i += piece {
			data := append(held, stream[i:min(i+piece, len(stream))]...)
			n, err := w.Feed(data)
			if err != nil {
				t.Fatalf("piece %d: %v", piece, err)
			}
			out = append(out, data[:n]...)
			held = append([]byte(nil), data[n:]...)
		}
		if !bytes.Equal(out, stream) || !slices.Equal(codes, []int64{49, 0, 51}) {
			t.Fatalf("piece %d: %d of %d bytes out, codes %v", piece, len(out), len(stream), codes)
		}
	}
	stop := errors.New("stop")
	w := &BindWatcher{MaxLen: 1024, OnBind: func(int64) error { return stop }}
	if n, err := w.Feed(stream); n != 0 || !errors.Is(err, stop) {
		t.Fatalf("OnBind's error: %d %v", n, err)
	}
	// ErrLastAnswer passes the first BindResponse, then stops.
	w = &BindWatcher{MaxLen: 1024, OnBind: func(int64) error { return ErrLastAnswer }}
	if n, err := w.Feed(stream); n != len(BindResponse(1, 49, "invalid credentials")) || !errors.Is(err, ErrLastAnswer) {
		t.Fatalf("ErrLastAnswer: %d %v", n, err)
	}
	w = &BindWatcher{MaxLen: 8, OnBind: func(int64) error { return nil }}
	if _, err := w.Feed(stream); !errors.Is(err, ErrMalformed) {
		t.Fatalf("an oversized BindResponse: %v", err)
	}
}

func FuzzBindWatcher(f *testing.F) {
	f.Add(BindResponse(1, 49, "x"))
	f.Add(slices.Concat(searchEntry(2, 300), BindResponse(3, 0, "")))
	f.Add([]byte{0x30, 0x84, 0xff, 0xff, 0xff, 0xff, 0x02, 0x01, 0x01, 0x61})
	f.Fuzz(func(t *testing.T, b []byte) {
		w := &BindWatcher{MaxLen: 1024, OnBind: func(int64) error { return nil }}
		n, _ := w.Feed(b)
		if n < 0 || n > len(b) {
			t.Fatalf("Feed returned %d of %d", n, len(b))
		}
		BindResult(b)
	})
}
