package ldapwire

import (
	ber "github.com/go-asn1-ber/asn1-ber"
)

// NoticeOfDisconnectionOID names the unsolicited notification a server
// sends before closing a connection it cannot serve (RFC 4511 4.4.1).
const NoticeOfDisconnectionOID = "1.3.6.1.4.1.1466.20036"

// ResultUnavailable is the resultCode "unavailable" (52): the server, or
// here the router, cannot serve the request; a client may try again.
const ResultUnavailable = 52

// NoticeOfDisconnection encodes the unsolicited ExtendedResponse (message
// ID 0) that tells a client why its connection is about to close. Rare
// path: go-asn1-ber's allocations don't matter here.
func NoticeOfDisconnection(resultCode int64, message string) []byte {
	msg := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAPMessage")
	msg.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 0, "messageID"))
	resp := ber.Encode(ber.ClassApplication, ber.TypeConstructed, 24, nil, "ExtendedResponse")
	resp.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, resultCode, "resultCode"))
	resp.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, "", "matchedDN"))
	resp.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, message, "diagnosticMessage"))
	resp.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 10, NoticeOfDisconnectionOID, "responseName"))
	msg.AppendChild(resp)
	return msg.Bytes()
}

// ExpectsResponse reports whether a server answers the message: every
// request but UnbindRequest and AbandonRequest.
func (m *Message) ExpectsResponse() bool { return m.Op != "unbind" && m.Op != "abandon" }

// Replayable reports whether the message may be sent again to another
// server when the first did not answer: it changes nothing there (bind,
// search, compare, StartTLS), so a late answer from the first does no harm.
func (m *Message) Replayable() bool {
	switch m.Op {
	case "bind", "search", "compare":
		return true
	}
	return m.StartTLS()
}
