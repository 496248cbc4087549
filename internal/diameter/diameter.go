// Package diameter frames and classifies Diameter messages (RFC 6733) for a
// layer 4 proxy: it reads whole messages off a stream, names each request's
// type and peer, and builds the answer that refuses a request. Headers and
// answers use github.com/fiorix/go-diameter; classification walks only the
// few top-level AVPs it needs, so it works for any application, known to a
// dictionary or not.
package diameter

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// Well-known application and command codes.
const (
	AppCommon = 0
	AppGy     = 4        // Diameter Credit Control (Gy/Ro)
	AppGx     = 16777238 // 3GPP Gx

	CmdCapabilitiesExchange = 257
	CmdCreditControl        = 272
	CmdDeviceWatchdog       = 280
	CmdDisconnectPeer       = 282

	// DefaultMaxLength bounds a message: larger ones close the connection.
	DefaultMaxLength = 64 * 1024

	// ResultTooBusy is DIAMETER_TOO_BUSY, the seed's rejection code.
	ResultTooBusy = 3002
)

// ErrMalformed marks input that is not a well-formed Diameter message.
var ErrMalformed = errors.New("malformed Diameter message")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// ParseHeader decodes and checks a message header: version 1, a length of
// at least 20 bytes and at most maxLen, a multiple of 4, and no reserved
// flag bits set.
func ParseHeader(b []byte, maxLen int) (*diam.Header, error) {
	if len(b) < diam.HeaderLength {
		return nil, malformed("header of %d bytes", len(b))
	}
	h, err := diam.DecodeHeader(b)
	if err != nil {
		return nil, malformed("%v", err)
	}
	switch {
	case h.Version != 1:
		return nil, malformed("version %d", h.Version)
	case h.MessageLength < diam.HeaderLength:
		return nil, malformed("length %d under 20", h.MessageLength)
	case int(h.MessageLength) > maxLen:
		return nil, malformed("length %d over the maximum %d", h.MessageLength, maxLen)
	case h.MessageLength%4 != 0:
		return nil, malformed("length %d not a multiple of 4", h.MessageLength)
	case h.CommandFlags&0x0f != 0:
		return nil, malformed("reserved command flags 0x%x", h.CommandFlags)
	}
	return h, nil
}

// ReadMessage reads one whole message from r.
func ReadMessage(r *bufio.Reader, maxLen int) ([]byte, *diam.Header, error) {
	hb, err := r.Peek(diam.HeaderLength)
	if err != nil {
		if len(hb) > 0 && errors.Is(err, io.EOF) {
			err = malformed("stream ends inside a header")
		}
		return nil, nil, err
	}
	h, err := ParseHeader(hb, maxLen)
	if err != nil {
		return nil, nil, err
	}
	msg := make([]byte, h.MessageLength)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, nil, malformed("stream ends inside a message: %v", err)
	}
	return msg, h, nil
}

// Info is what the proxy needs to know of a message.
type Info struct {
	Header        *diam.Header
	Request       bool
	CCRequestType uint32 // AVP 416, 0 if absent
	SessionID     string // AVP 263
	OriginHost    string // AVP 264
	OriginRealm   string // AVP 296
}

// Classify walks msg's top-level AVPs (checking every length) and picks
// out those Info names.
func Classify(msg []byte, h *diam.Header) (Info, error) {
	in := Info{Header: h, Request: h.CommandFlags&diam.RequestFlag != 0}
	b := msg[diam.HeaderLength:]
	for len(b) > 0 {
		if len(b) < 8 {
			return in, malformed("truncated AVP header")
		}
		code := binary.BigEndian.Uint32(b[0:4])
		flags := b[4]
		l := int(b[5])<<16 | int(b[6])<<8 | int(b[7])
		hdr := 8
		if flags&avp.Vbit != 0 {
			hdr = 12
		}
		if l < hdr || l > len(b) {
			return in, malformed("AVP %d length %d with %d bytes left", code, l, len(b))
		}
		data := b[hdr:l]
		switch {
		case hdr == 12:
		case code == avp.CCRequestType && len(data) == 4:
			in.CCRequestType = binary.BigEndian.Uint32(data)
		case code == avp.SessionID:
			in.SessionID = string(data)
		case code == avp.OriginHost:
			in.OriginHost = string(data)
		case code == avp.OriginRealm:
			in.OriginRealm = string(data)
		}
		padded := (l + 3) &^ 3
		if padded > len(b) {
			padded = len(b)
		}
		b = b[padded:]
	}
	return in, nil
}

// Type names a message's type for rate-limit profiles: "cer", "dwr",
// "dpr" for base messages; "gx-ccr-i", "gx-ccr-u", "gx-ccr-t", "gx-ccr-e"
// and the same for "gy-" for credit control; otherwise
// "<application>-<command>" in decimal. Answers get an "a" suffix
// ("cea", "gx-cca-i", "4-272a").
func (in Info) Type() string {
	h := in.Header
	switch h.CommandCode {
	case CmdCapabilitiesExchange:
		return pick(in.Request, "cer", "cea")
	case CmdDeviceWatchdog:
		return pick(in.Request, "dwr", "dwa")
	case CmdDisconnectPeer:
		return pick(in.Request, "dpr", "dpa")
	}
	if h.CommandCode == CmdCreditControl && (h.ApplicationID == AppGx || h.ApplicationID == AppGy) && in.CCRequestType >= 1 && in.CCRequestType <= 4 {
		app := "gx"
		if h.ApplicationID == AppGy {
			app = "gy"
		}
		return app + pick(in.Request, "-ccr-", "-cca-") + string("iute"[in.CCRequestType-1])
	}
	t := strconv.FormatUint(uint64(h.ApplicationID), 10) + "-" + strconv.FormatUint(uint64(h.CommandCode), 10)
	return pick(in.Request, t, t+"a")
}

// Base reports whether the message belongs to the base protocol's peer
// exchanges (CER/CEA, DWR/DWA, DPR/DPA), which are never limited.
func (in Info) Base() bool {
	switch in.Header.CommandCode {
	case CmdCapabilitiesExchange, CmdDeviceWatchdog, CmdDisconnectPeer:
		return in.Header.ApplicationID == AppCommon
	}
	return false
}

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// Refusal builds the answer that refuses a request: the same command,
// application and Hop-by-Hop and End-to-End identifiers, its Session-Id,
// Result-Code, the proxy's Origin-Host and Origin-Realm, and an
// Error-Message. With ResultTooBusy-class codes (3xxx, protocol errors)
// the E bit is set, as RFC 6733 requires.
func Refusal(in Info, resultCode uint32, originHost, originRealm, errorMessage string) ([]byte, error) {
	h := in.Header
	flags := h.CommandFlags &^ (diam.RequestFlag | diam.RetransmittedFlag)
	if resultCode >= 3000 && resultCode < 4000 {
		flags |= diam.ErrorFlag
	}
	m := diam.NewMessage(h.CommandCode, flags, h.ApplicationID, h.HopByHopID, h.EndToEndID, dict.Default)
	if in.SessionID != "" {
		m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(in.SessionID))
	}
	m.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(resultCode))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(originHost))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(originRealm))
	if errorMessage != "" {
		m.NewAVP(avp.ErrorMessage, 0, 0, datatype.UTF8String(errorMessage))
	}
	return m.Serialize()
}

// Request builds a request as a peer sends it, for test peers and load
// tools: Session-Id (when given), Origin-Host and Origin-Realm, and for a
// credit-control request (reqType > 0) Auth-Application-Id,
// CC-Request-Type and CC-Request-Number.
func Request(cmd, app, reqType, hopByHop, endToEnd uint32, session, originHost, originRealm string) ([]byte, error) {
	m := diam.NewRequest(cmd, app, dict.Default)
	m.Header.HopByHopID, m.Header.EndToEndID = hopByHop, endToEnd
	if session != "" {
		m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(session))
	}
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(originHost))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(originRealm))
	if reqType != 0 {
		m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(app))
		m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(reqType))
		m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
	}
	return m.Serialize()
}
