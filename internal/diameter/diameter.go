// Package diameter frames and classifies Diameter messages (RFC 6733) for a
// layer 4 proxy: it reads whole messages off a stream, names each request's
// type and peer, and builds the answer that refuses a request. Headers and
// answers use github.com/fiorix/go-diameter; classification walks only the
// few top-level AVPs it needs, so it works for any application, known to a
// dictionary or not.
//
// The data path of a proxy: a Framer reads a stream through one buffer and
// hands out whole messages without copying them; Info.Parse classifies one
// without allocating; a BoundaryWriter passes the other direction's
// stream through and slips the proxy's own messages in only between whole
// messages. BenchmarkRelay measures them against a plain relay in the same
// run (BENCHMARKS.md).
package diameter

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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

	// ResultUnableToDeliver, DIAMETER_UNABLE_TO_DELIVER (RFC 6733
	// §7.1.3), a protocol error (E bit set), is the default result code
	// of a rejected request.
	ResultUnableToDeliver = 3002
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
	if _, err := MessageLength(b, maxLen); err != nil {
		return nil, err
	}
	h := new(diam.Header)
	decodeHeader(b, h)
	return h, nil
}

// MessageLength checks a message header as ParseHeader does, without
// decoding it (nor allocating), and returns the message's length. b holds
// at least the 20 header bytes.
func MessageLength(b []byte, maxLen int) (int, error) {
	l := int(b[1])<<16 | int(b[2])<<8 | int(b[3])
	switch {
	case b[0] != 1:
		return 0, malformed("version %d", b[0])
	case l < diam.HeaderLength:
		return 0, malformed("length %d under 20", l)
	case l > maxLen:
		return 0, malformed("length %d over the maximum %d", l, maxLen)
	case l%4 != 0:
		return 0, malformed("length %d not a multiple of 4", l)
	case b[4]&0x0f != 0:
		return 0, malformed("reserved command flags 0x%x", b[4])
	}
	return l, nil
}

// decodeHeader fills h from the 20 header bytes (go-diameter's decoder,
// into h instead of a new header).
func decodeHeader(b []byte, h *diam.Header) { _ = h.DecodeFromBytes(b) }

// ReadMessage reads one whole message from r into a new slice (a Framer
// reads them without copying).
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
	SessionID     string // AVP 263 (Classify; Parse leaves it empty)
	OriginHost    string // AVP 264
	OriginRealm   string // AVP 296
	// SessionIDRaw is the Session-Id's bytes in the message (valid while
	// the message is): Parse sets it instead of SessionID, which only a
	// refusal needs.
	SessionIDRaw []byte
}

// Classify walks msg's top-level AVPs (checking every length) and picks
// out those Info names.
func Classify(msg []byte, h *diam.Header) (Info, error) {
	in := Info{Header: h}
	err := in.avps(msg)
	in.SessionID = string(in.SessionIDRaw)
	return in, err
}

// Parse fills in from msg, a whole message (as a Framer hands it out),
// reusing in's header and strings: the Origin-Host and Origin-Realm of a
// connection's messages are the same from one to the next, and a string
// equal to the one in hand is kept, not made again. So a connection's
// decisions allocate nothing. The Session-Id is left in SessionIDRaw.
func (in *Info) Parse(msg []byte) error {
	if len(msg) < diam.HeaderLength {
		return malformed("message of %d bytes", len(msg))
	}
	if in.Header == nil {
		in.Header = new(diam.Header)
	}
	decodeHeader(msg, in.Header)
	in.SessionID = ""
	return in.avps(msg)
}

// avps walks the message's top-level AVPs.
func (in *Info) avps(msg []byte) error {
	h := in.Header
	in.Request = h.CommandFlags&diam.RequestFlag != 0
	in.CCRequestType, in.SessionIDRaw = 0, nil
	oh, or := false, false
	defer func() {
		if !oh {
			in.OriginHost = ""
		}
		if !or {
			in.OriginRealm = ""
		}
	}()
	b := msg[diam.HeaderLength:]
	for len(b) > 0 {
		if len(b) < 8 {
			return malformed("truncated AVP header")
		}
		code := binary.BigEndian.Uint32(b[0:4])
		flags := b[4]
		l := int(b[5])<<16 | int(b[6])<<8 | int(b[7])
		hdr := 8
		if flags&avp.Vbit != 0 {
			hdr = 12
		}
		if l < hdr || l > len(b) {
			return malformed("AVP %d length %d with %d bytes left", code, l, len(b))
		}
		data := b[hdr:l]
		switch {
		case hdr == 12:
		case code == avp.CCRequestType && len(data) == 4:
			in.CCRequestType = binary.BigEndian.Uint32(data)
		case code == avp.SessionID:
			in.SessionIDRaw = data
		case code == avp.OriginHost:
			oh = true
			if string(data) != in.OriginHost { // compared without a copy
				in.OriginHost = string(data)
			}
		case code == avp.OriginRealm:
			or = true
			if string(data) != in.OriginRealm {
				in.OriginRealm = string(data)
			}
		}
		padded := (l + 3) &^ 3
		if padded > len(b) {
			padded = len(b)
		}
		b = b[padded:]
	}
	return nil
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
		app, dir := 0, 0
		if h.ApplicationID == AppGy {
			app = 1
		}
		if !in.Request {
			dir = 1
		}
		return ccTypes[app][dir][in.CCRequestType-1]
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

// ccTypes are the credit-control types' names by application (Gx, Gy),
// request or answer, and CC-Request-Type: made once, so that naming a
// message allocates nothing.
var ccTypes = func() (t [2][2][4]string) {
	for a, app := range []string{"gx", "gy"} {
		for d, dir := range []string{"-ccr-", "-cca-"} {
			for k := range 4 {
				t[a][d][k] = app + dir + string("iute"[k])
			}
		}
	}
	return t
}()

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// Refusal builds the answer that refuses a request: the same command,
// application and Hop-by-Hop and End-to-End identifiers, its Session-Id,
// Result-Code, the proxy's Origin-Host and Origin-Realm, and an
// Error-Message. With protocol-error codes (3xxx) the E bit is set, as
// RFC 6733 requires.
func Refusal(in Info, resultCode uint32, originHost, originRealm, errorMessage string) ([]byte, error) {
	h := in.Header
	flags := h.CommandFlags &^ (diam.RequestFlag | diam.RetransmittedFlag)
	if resultCode >= 3000 && resultCode < 4000 {
		flags |= diam.ErrorFlag
	}
	m := diam.NewMessage(h.CommandCode, flags, h.ApplicationID, h.HopByHopID, h.EndToEndID, dict.Default)
	// NewMessage replaces a zero identifier with a random one; an answer
	// carries the request's, zero included (RFC 6733 §3).
	m.Header.HopByHopID, m.Header.EndToEndID = h.HopByHopID, h.EndToEndID
	sid := in.SessionID
	if sid == "" {
		sid = string(in.SessionIDRaw)
	}
	if sid != "" {
		m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(sid))
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

// vendor3GPP is 3GPP's vendor id, under which Gx is vendor-specific.
const vendor3GPP = 10415

// AddCapabilities adds what a test peer's or load tool's CER or CEA
// carries: Origin-Host and Origin-Realm, 127.0.0.1 as Host-IP-Address,
// 3GPP as Vendor-Id, product as Product-Name, Gy as an auth application
// and Gx as a 3GPP vendor-specific one.
func AddCapabilities(m *diam.Message, host, realm, product string) {
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(host))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(realm))
	m.NewAVP(avp.HostIPAddress, avp.Mbit, 0, datatype.Address(net.IPv4(127, 0, 0, 1).To4()))
	m.NewAVP(avp.VendorID, avp.Mbit, 0, datatype.Unsigned32(vendor3GPP))
	m.NewAVP(avp.ProductName, 0, 0, datatype.UTF8String(product))
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(AppGy))
	m.NewAVP(avp.VendorSpecificApplicationID, avp.Mbit, 0, &diam.GroupedAVP{AVP: []*diam.AVP{
		diam.NewAVP(avp.VendorID, avp.Mbit, 0, datatype.Unsigned32(vendor3GPP)),
		diam.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(AppGx)),
	}})
}
