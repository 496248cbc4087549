package doic

import (
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// cca is a Gx CCA's body (without the header), with extra appended.
func cca(b testing.TB, extra ...[]byte) []byte {
	m := diam.NewMessage(272, 0, 16777238, 1, 1, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("pgw1.example;1;2"))
	m.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(2001))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pcrf1.example"))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("operator.example"))
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(16777238))
	m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(2))
	m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(1))
	raw, err := m.Serialize()
	if err != nil {
		b.Fatal(err)
	}
	body := raw[20:]
	for _, e := range extra {
		body = append(body, e...)
	}
	return body
}

// readAnswer is what the agent does per answer: find our AVPs, and parse
// and apply what it found.
func readAnswer(body []byte, tb *Table, now time.Time) {
	var f Found
	Scan(body, &f)
	for _, d := range f.OLRs[:f.NOLR] {
		if o, r := ParseOLR(d); r == OK {
			tb.Apply([]byte("pcrf1.example"), o, now)
		}
	}
	for _, d := range f.Loads[:f.NLoad] {
		ParseLoad(d)
	}
}

func BenchmarkReadAnswer(b *testing.B) {
	now := time.Unix(0, 0)
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"without", cca(b)},
		{"with_olr_and_load", cca(b, EncodeOLR(HostReport, 1, 50, 10*time.Second, ""), EncodeLoad(LoadHost, 1000, "pcrf1.example"))},
	} {
		b.Run(c.name, func(b *testing.B) {
			tb := NewTable(0)
			b.ReportAllocs()
			for b.Loop() {
				readAnswer(c.body, tb, now)
			}
		})
	}
}

func TestReadingAnswersDoesNotAllocate(t *testing.T) {
	now := time.Unix(0, 0)
	tb := NewTable(0)
	for name, body := range map[string][]byte{
		"without": cca(t),
		"with":    cca(t, EncodeOLR(HostReport, 1, 50, 10*time.Second, ""), EncodeLoad(LoadHost, 1000, "pcrf1.example")),
	} {
		readAnswer(body, tb, now) // the first takes the report
		if n := testing.AllocsPerRun(100, func() { readAnswer(body, tb, now) }); n != 0 {
			t.Errorf("%s: %.1f allocations per answer", name, n)
		}
	}
}
