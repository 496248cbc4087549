package diameter

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// ccr builds a credit-control request from pgw2.example.
func ccr(t testing.TB, app uint32, reqType uint32, session string) []byte {
	b, err := Request(CmdCreditControl, app, reqType, 0x1111, 0x2222, session, "pgw2.example", "example")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClassifyCreditControlTypes(t *testing.T) {
	for _, tc := range []struct {
		app     uint32
		reqType uint32
		want    string
	}{
		{AppGx, 1, "gx-ccr-i"}, {AppGx, 2, "gx-ccr-u"}, {AppGx, 3, "gx-ccr-t"}, {AppGx, 4, "gx-ccr-e"},
		{AppGy, 1, "gy-ccr-i"}, {AppGy, 3, "gy-ccr-t"},
	} {
		b := ccr(t, tc.app, tc.reqType, "pgw2;1;2")
		msg, h, err := ReadMessage(bufio.NewReader(bytes.NewReader(b)), DefaultMaxLength)
		if err != nil {
			t.Fatal(err)
		}
		in, err := Classify(msg, h)
		if err != nil {
			t.Fatal(err)
		}
		if in.Type() != tc.want || !in.Request || in.OriginHost != "pgw2.example" || in.SessionID != "pgw2;1;2" || in.Base() {
			t.Errorf("%+v: type %s", in, in.Type())
		}
	}
	cer := diam.NewRequest(CmdCapabilitiesExchange, 0, dict.Default)
	cer.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pgw2.example"))
	b, _ := cer.Serialize()
	h, _ := ParseHeader(b, DefaultMaxLength)
	in, _ := Classify(b, h)
	if in.Type() != "cer" || !in.Base() {
		t.Errorf("CER: %s base %v", in.Type(), in.Base())
	}
}

// The refusal matches its request and says why, in go-diameter's reading.
func TestRefusal(t *testing.T) {
	b := ccr(t, AppGx, 1, "pgw2;9;1")
	h, _ := ParseHeader(b, DefaultMaxLength)
	in, _ := Classify(b, h)
	ans, err := Refusal(in, ResultUnableToDeliver, "dra.example", "example", "rate limit exceeded")
	if err != nil {
		t.Fatal(err)
	}
	m, err := diam.ReadMessage(bytes.NewReader(ans), dict.Default)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.HopByHopID != 0x1111 || m.Header.EndToEndID != 0x2222 || m.Header.CommandCode != CmdCreditControl ||
		m.Header.ApplicationID != AppGx || m.Header.CommandFlags&diam.RequestFlag != 0 || m.Header.CommandFlags&diam.ErrorFlag == 0 {
		t.Fatalf("header %v", m.Header)
	}
	want := map[uint32]string{avp.SessionID: "pgw2;9;1", avp.ResultCode: "3002", avp.OriginHost: "dra.example",
		avp.OriginRealm: "example", avp.ErrorMessage: "rate limit exceeded"}
	for code, v := range want {
		a, err := m.FindAVP(code, 0)
		if err != nil {
			t.Fatalf("AVP %d: %v", code, err)
		}
		if got := avpString(a.Data); got != v {
			t.Errorf("AVP %d = %q, want %q", code, got, v)
		}
	}
}

// A request's zero identifiers come back zero: go-diameter's NewMessage
// would otherwise put random ones in their place.
func TestRefusalKeepsZeroIdentifiers(t *testing.T) {
	in := Info{Header: &diam.Header{CommandCode: CmdCreditControl, ApplicationID: AppGx}, Request: true, SessionID: "s"}
	for range 20 {
		ans, err := Refusal(in, ResultUnableToDeliver, "dra", "realm", "")
		if err != nil {
			t.Fatal(err)
		}
		m, err := diam.ReadMessage(bytes.NewReader(ans), dict.Default)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.HopByHopID != 0 || m.Header.EndToEndID != 0 {
			t.Fatalf("hop-by-hop %#x, end-to-end %#x: want the request's zeros", m.Header.HopByHopID, m.Header.EndToEndID)
		}
	}
}

func avpString(d datatype.Type) string {
	switch v := d.(type) {
	case datatype.Unsigned32:
		return itoa(uint32(v))
	case datatype.UTF8String:
		return string(v)
	case datatype.DiameterIdentity:
		return string(v)
	}
	return d.String()
}

func itoa(v uint32) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		if v /= 10; v == 0 {
			return string(b)
		}
	}
}

func TestMalformed(t *testing.T) {
	good := ccr(t, AppGx, 1, "s")
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"version 2":        mut(func(b []byte) []byte { b[0] = 2; return b }),
		"length 16":        mut(func(b []byte) []byte { b[1], b[2], b[3] = 0, 0, 16; return b }),
		"length too large": mut(func(b []byte) []byte { b[1], b[2], b[3] = 0x10, 0, 0; return b }),
		"length not /4":    mut(func(b []byte) []byte { b[3]++; return b }),
		"reserved flags":   mut(func(b []byte) []byte { b[4] |= 1; return b }),
		"truncated":        good[:len(good)-4],
		"header cut":       good[:10],
	} {
		_, _, err := ReadMessage(bufio.NewReader(bytes.NewReader(b)), DefaultMaxLength)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	// A truncated AVP: the header's length is fine, an AVP's is not.
	b := mut(func(b []byte) []byte { b[20+5], b[20+6], b[20+7] = 0, 0x10, 0; return b })
	h, _ := ParseHeader(b, DefaultMaxLength)
	if _, err := Classify(b, h); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated AVP: %v", err)
	}
	// A clean end of stream is io.EOF, not malformed.
	if _, _, err := ReadMessage(bufio.NewReader(bytes.NewReader(nil)), DefaultMaxLength); err != io.EOF {
		t.Errorf("empty stream: %v", err)
	}
}

// FuzzFramer feeds arbitrary bytes through the framer and classifier: no
// panic, and every message returned is exactly its header's length.
func FuzzFramer(f *testing.F) {
	f.Add(ccr(f, AppGx, 1, "seed;1"))
	f.Add(append(ccr(f, AppGy, 3, "seed;2"), ccr(f, AppGx, 2, "seed;3")...))
	cer := diam.NewRequest(CmdCapabilitiesExchange, 0, dict.Default)
	cer.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("x"))
	b, _ := cer.Serialize()
	f.Add(b)
	f.Add([]byte{1, 0, 0, 20, 0x80, 0, 1, 16, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2})
	f.Add([]byte{1, 0, 0, 32, 0x80, 0, 1, 16, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 1, 0xa0, 0x40, 0, 0, 0xff, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		fr := NewFramer(bytes.NewReader(data), 256, 4096) // 256: the large-message path too
		var fin Info
		for {
			msg, h, err := ReadMessage(r, 4096)
			fmsg, ferr := fr.Next()
			if (err == nil) != (ferr == nil) || !bytes.Equal(msg, fmsg) {
				t.Fatalf("framer: %x, %v; ReadMessage: %x, %v", fmsg, ferr, msg, err)
			}
			if err != nil {
				return
			}
			cerr := fin.Parse(fmsg)
			if len(msg) != int(h.MessageLength) {
				t.Fatalf("message of %d bytes, header says %d", len(msg), h.MessageLength)
			}
			in, err := Classify(msg, h)
			if (err == nil) != (cerr == nil) || (err == nil && (fin.Type() != in.Type() || fin.OriginHost != in.OriginHost ||
				fin.OriginRealm != in.OriginRealm || string(fin.SessionIDRaw) != in.SessionID || fin.CCRequestType != in.CCRequestType)) {
				t.Fatalf("Parse %+v, %v; Classify %+v, %v", fin, cerr, in, err)
			}
			if err == nil {
				_ = in.Type()
				if in.Request {
					if _, err := Refusal(in, ResultUnableToDeliver, "dra", "realm", "x"); err != nil {
						t.Fatalf("refusal for a classified request: %v", err)
					}
				}
			}
		}
	})
}

// A CER built with AddCapabilities reads back, in go-diameter's dictionary,
// with the identity, address, vendor, product, Gy and 3GPP's Gx.
func TestAddCapabilities(t *testing.T) {
	cer := diam.NewRequest(CmdCapabilitiesExchange, 0, dict.Default)
	AddCapabilities(cer, "pgw1.example", "example", "load")
	b, err := cer.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	m, err := diam.ReadMessage(bytes.NewReader(b), dict.Default)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		OriginHost    datatype.DiameterIdentity `avp:"Origin-Host"`
		OriginRealm   datatype.DiameterIdentity `avp:"Origin-Realm"`
		HostIPAddress datatype.Address          `avp:"Host-IP-Address"`
		VendorID      datatype.Unsigned32       `avp:"Vendor-Id"`
		ProductName   datatype.UTF8String       `avp:"Product-Name"`
		AuthAppID     datatype.Unsigned32       `avp:"Auth-Application-Id"`
		VendorApp     struct {
			VendorID  datatype.Unsigned32 `avp:"Vendor-Id"`
			AuthAppID datatype.Unsigned32 `avp:"Auth-Application-Id"`
		} `avp:"Vendor-Specific-Application-Id"`
	}
	if err := m.Unmarshal(&got); err != nil {
		t.Fatal(err)
	}
	if got.OriginHost != "pgw1.example" || got.OriginRealm != "example" || net.IP(got.HostIPAddress).String() != "127.0.0.1" ||
		got.VendorID != 10415 || got.ProductName != "load" || got.AuthAppID != AppGy ||
		got.VendorApp.VendorID != 10415 || got.VendorApp.AuthAppID != AppGx {
		t.Fatalf("CER reads back as %+v", got)
	}
}
