package ldapwire

import (
	"testing"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"
)

// The notice decodes as go-ldap's reference decoder reads an LDAPMessage:
// message ID 0, an ExtendedResponse with the result code, message and the
// notice's name.
func TestNoticeOfDisconnection(t *testing.T) {
	b := NoticeOfDisconnection(ResultUnavailable, "node did not answer")
	p, err := ber.DecodePacketErr(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Children) != 2 || p.Children[0].Value.(int64) != 0 {
		t.Fatalf("envelope %v", p.Children)
	}
	op := p.Children[1]
	if op.ClassType != ber.ClassApplication || op.Tag != ldap.ApplicationExtendedResponse {
		t.Fatalf("protocolOp %v/%v", op.ClassType, op.Tag)
	}
	if code := op.Children[0].Value.(int64); code != ResultUnavailable {
		t.Fatalf("resultCode %d", code)
	}
	if msg := op.Children[2].Value.(string); msg != "node did not answer" {
		t.Fatalf("diagnosticMessage %q", msg)
	}
	if name := op.Children[3].Data.String(); op.Children[3].Tag != 10 || name != NoticeOfDisconnectionOID {
		t.Fatalf("responseName %q", name)
	}
	if m, err := Parse(b); err != nil || m.Op != "extended_response" || m.ID != 0 {
		t.Fatalf("own parser: %+v %v", m, err)
	}
}

func TestReplayableAndExpectsResponse(t *testing.T) {
	for _, tc := range []struct {
		m                 Message
		replay, responded bool
	}{
		{Message{Op: "bind"}, true, true},
		{Message{Op: "search"}, true, true},
		{Message{Op: "compare"}, true, true},
		{Message{Op: "extended", Extended: StartTLSOID}, true, true},
		{Message{Op: "extended", Extended: "1.3.6.1.4.1.4203.1.11.1"}, false, true}, // password modify
		{Message{Op: "add"}, false, true},
		{Message{Op: "modify"}, false, true},
		{Message{Op: "unbind"}, false, false},
		{Message{Op: "abandon"}, false, false},
	} {
		if tc.m.Replayable() != tc.replay || tc.m.ExpectsResponse() != tc.responded {
			t.Errorf("%+v: replayable %v, expects response %v", tc.m, tc.m.Replayable(), tc.m.ExpectsResponse())
		}
	}
}
