package ldapwire

import (
	"errors"
	"fmt"

	ber "github.com/go-asn1-ber/asn1-ber"
)

// Result codes a router uses (RFC 4511 4.1.9).
const (
	ResultSuccess            = 0
	ResultSASLBindInProgress = 14
	ResultBusy               = 51
)

const tagBindResponse = 0x61 // application 1, constructed

// BindResult returns the resultCode of the BindResponse held whole in b;
// ok is false if b is not a well-formed BindResponse.
func BindResult(b []byte) (code int64, ok bool) {
	tag, body, rest, err := element(b)
	if err != nil || tag != tagMessage || len(rest) > 0 {
		return 0, false
	}
	tag, id, body, err := element(body)
	if err != nil || tag != tagMessageID || len(id) == 0 || len(id) > 8 {
		return 0, false
	}
	tag, op, _, err := element(body)
	if err != nil || tag != tagBindResponse {
		return 0, false
	}
	tag, rc, _, err := element(op)
	if err != nil || tag != 0x0a || len(rc) == 0 || len(rc) > 8 { // ENUMERATED
		return 0, false
	}
	return integer(rc), true
}

// BindResponse encodes a BindResponse to message id with code and a
// diagnostic message: a router's refusal of a bind it will not forward
// (busy). Rare path: go-asn1-ber's allocations don't matter here.
func BindResponse(id, code int64, message string) []byte {
	msg := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAPMessage")
	msg.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, id, "messageID"))
	resp := ber.Encode(ber.ClassApplication, ber.TypeConstructed, 1, nil, "BindResponse")
	resp.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, code, "resultCode"))
	resp.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, "", "matchedDN"))
	resp.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, message, "diagnosticMessage"))
	msg.AppendChild(resp)
	return msg.Bytes()
}

// maxFrame bounds a node's message for framing only: it is passed on in
// pieces, never held (length fields of more than 4 octets are refused).
const maxFrame = 1<<32 - 1

// ErrLastAnswer, from a BindWatcher's OnBind, ends the connection once the
// client has the BindResponse.
var ErrLastAnswer = errors.New("ldapwire: the connection ends after this answer")

// A BindWatcher watches what a node sends on a routed connection: each
// BindResponse is held until whole (at most MaxLen bytes), its resultCode
// handed to OnBind, and then passed on; other messages are framed by their
// envelope and passed as they arrive. OnBind returning an error stops the
// relay before the response is passed on; returning ErrLastAnswer (or an
// error wrapping it) stops it right after the response is passed on.
type BindWatcher struct {
	OnBind func(code int64) error
	MaxLen int64

	rest int // bytes of the current message still to pass
}

// Between reports whether the bytes Feed has passed so far end between
// two messages (a router may then write a message of its own to the
// client).
func (w *BindWatcher) Between() bool { return w.rest == 0 }

// Feed takes the next bytes from the node and returns how many of them
// may be passed on now (see relay.Filter).
func (w *BindWatcher) Feed(b []byte) (int, error) {
	i := 0
	for i < len(b) {
		if w.rest > 0 {
			k := min(w.rest, len(b)-i)
			i += k
			w.rest -= k
			continue
		}
		size, op, err := frameOp(b[i:], maxFrame)
		if errors.Is(err, ErrShort) {
			return i, nil
		}
		if err != nil {
			return i, err
		}
		if op|0x20 == tagBindResponse {
			if int64(size) > w.MaxLen {
				return i, fmt.Errorf("%w: BindResponse longer than %d bytes", ErrMalformed, w.MaxLen)
			}
			if len(b)-i < size {
				return i, nil
			}
			code, ok := BindResult(b[i : i+size])
			if !ok {
				return i, fmt.Errorf("%w: BindResponse", ErrMalformed)
			}
			if err := w.OnBind(code); errors.Is(err, ErrLastAnswer) {
				return i + size, err
			} else if err != nil {
				return i, err
			}
		}
		w.rest = size
	}
	return i, nil
}
