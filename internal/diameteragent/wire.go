package diameteragent

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
)

// Command codes the agent acts on.
const (
	cmdCER = diameter.CmdCapabilitiesExchange
	cmdDWR = diameter.CmdDeviceWatchdog
	cmdDPR = diameter.CmdDisconnectPeer
	cmdCCR = diameter.CmdCreditControl
	cmdSTR = 275

	ccInitial   = 1 // CC-Request-Type INITIAL_REQUEST
	ccTerminate = 3 // CC-Request-Type TERMINATION_REQUEST

	relayApp = 0xffffffff // the Relay Application Id (RFC 6733 §2.4)
)

// Result codes the agent writes itself (RFC 6733 §7.1).
const (
	ResultSuccess             = 2001
	ResultUnableToDeliver     = 3002
	ResultRealmNotServed      = 3003
	ResultTooBusy             = 3004
	ResultLoopDetected        = 3005
	ResultMissingAVP          = 5005
	ResultNoCommonApplication = 5010
	ResultUnableToComply      = 5012
)

// resultName names the result codes a CEA refusal most often carries, for
// the reason a peer is down (" DIAMETER_…", or "").
func resultName(code uint32) string {
	switch code {
	case ResultNoCommonApplication:
		return " DIAMETER_NO_COMMON_APPLICATION"
	case 3010:
		return " DIAMETER_UNKNOWN_PEER"
	case ResultUnableToComply:
		return " DIAMETER_UNABLE_TO_COMPLY"
	}
	return ""
}

// msgInfo is what the agent reads of a message: the header and the
// top-level AVPs it routes by. Byte fields are slices of the message (valid
// while it is). scan fills it without allocating.
type msgInfo struct {
	hdr                       diam.Header
	request                   bool
	sessionID, originHost     []byte
	originRealm, destHost     []byte
	destRealm, errorMessage   []byte
	resultCode, ccRequestType uint32
	loop                      bool // a Route-Record names the agent
	apps                      []uint32
	hasDestRealm, hasDestHost bool
	wantApps                  bool // collect the advertised applications (CER/CEA only)
	routeRecords              int
	hasOC                     bool // an OC-Supported-Features, OC-OLR or Load (doic.Scan finds them)
}

// scan walks msg's header and top-level AVPs, checking every length. self
// is the agent's Origin-Host: a Route-Record equal to it (ignoring case,
// as identities are FQDNs) marks a loop.
func scan(msg []byte, self string, in *msgInfo) error {
	if len(msg) < diam.HeaderLength {
		return malformed("message of %d bytes", len(msg))
	}
	if _, err := diameter.MessageLength(msg, len(msg)); err != nil {
		return err
	}
	if int(msg[1])<<16|int(msg[2])<<8|int(msg[3]) != len(msg) {
		return malformed("header length differs from the message's %d bytes", len(msg))
	}
	_ = in.hdr.DecodeFromBytes(msg)
	want := in.wantApps
	*in = msgInfo{hdr: in.hdr, apps: in.apps[:0], wantApps: want}
	in.request = in.hdr.CommandFlags&diam.RequestFlag != 0
	return walkAVPs(msg[diam.HeaderLength:], func(code uint32, vendor bool, data []byte) error {
		if vendor {
			return nil
		}
		switch code {
		case avp.SessionID:
			in.sessionID = data
		case avp.OriginHost:
			in.originHost = data
		case avp.OriginRealm:
			in.originRealm = data
		case avp.DestinationHost:
			in.destHost, in.hasDestHost = data, true
		case avp.DestinationRealm:
			in.destRealm, in.hasDestRealm = data, true
		case avp.ErrorMessage:
			in.errorMessage = data
		case doic.CodeSupportedFeatures, doic.CodeOLR, doic.CodeLoad:
			in.hasOC = true
		case avp.RouteRecord:
			in.routeRecords++
			if bytes.EqualFold(data, []byte(self)) {
				in.loop = true
			}
		case avp.ResultCode:
			if len(data) == 4 {
				in.resultCode = binary.BigEndian.Uint32(data)
			}
		case avp.CCRequestType:
			if len(data) == 4 {
				in.ccRequestType = binary.BigEndian.Uint32(data)
			}
		case avp.AuthApplicationID, avp.AcctApplicationID:
			if want && len(data) == 4 {
				in.apps = append(in.apps, binary.BigEndian.Uint32(data))
			}
		case avp.VendorSpecificApplicationID:
			if want {
				return walkAVPs(data, func(c uint32, v bool, d []byte) error {
					if !v && (c == avp.AuthApplicationID || c == avp.AcctApplicationID) && len(d) == 4 {
						in.apps = append(in.apps, binary.BigEndian.Uint32(d))
					}
					return nil
				})
			}
		}
		return nil
	})
}

// walkAVPs calls f with each AVP of b (a message body or a grouped AVP's
// data): its code, whether it has a Vendor-Id, and its data.
func walkAVPs(b []byte, f func(code uint32, vendor bool, data []byte) error) error {
	for len(b) > 0 {
		if len(b) < 8 {
			return malformed("truncated AVP header")
		}
		code := binary.BigEndian.Uint32(b[0:4])
		l := int(b[5])<<16 | int(b[6])<<8 | int(b[7])
		hdr := 8
		vendor := b[4]&avp.Vbit != 0
		if vendor {
			hdr = 12
		}
		if l < hdr || l > len(b) {
			return malformed("AVP %d length %d with %d bytes left", code, l, len(b))
		}
		if err := f(code, vendor, b[hdr:l]); err != nil {
			return err
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return nil
}

// malformed wraps internal/diameter's ErrMalformed, so callers test one error.
func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", diameter.ErrMalformed, fmt.Sprintf(format, a...))
}

// isTermination reports whether a request ends its session: CCR-T or STR.
func (in *msgInfo) isTermination() bool {
	switch in.hdr.CommandCode {
	case cmdCCR:
		return in.ccRequestType == ccTerminate
	case cmdSTR:
		return true
	}
	return false
}

// base reports whether the message is a peer-level exchange (CER, DWR, DPR
// and their answers), handled by the agent and never routed.
func (in *msgInfo) base() bool {
	switch in.hdr.CommandCode {
	case cmdCER, cmdDWR, cmdDPR:
		return in.hdr.ApplicationID == 0
	}
	return false
}

// isDPA reports whether the message answers a DPR.
func isDPA(in *msgInfo) bool { return !in.request && in.base() && in.hdr.CommandCode == cmdDPR }

// info is the message as internal/diameter names and refuses it.
func (in *msgInfo) info() diameter.Info {
	return diameter.Info{Header: &in.hdr, Request: in.request, CCRequestType: in.ccRequestType, SessionIDRaw: in.sessionID}
}

// hopByHop and setHopByHop read and write a message's Hop-by-Hop id.
func hopByHop(msg []byte) uint32       { return binary.BigEndian.Uint32(msg[12:16]) }
func setHopByHop(msg []byte, v uint32) { binary.BigEndian.PutUint32(msg[12:16], v) }

// setRetransmitted sets the T flag (RFC 6733 §3: a request re-sent after a
// link failover).
func setRetransmitted(msg []byte) { msg[4] |= diam.RetransmittedFlag }

// forwarded copies msg with a Route-Record AVP naming from (the peer the
// request came from, RFC 6733 §6.7.1) and extra (encoded AVPs) appended,
// and the length fixed.
func forwarded(msg []byte, from string, extra []byte) []byte {
	l := 8 + len(from)
	padded := (l + 3) &^ 3
	out := make([]byte, len(msg)+padded+len(extra))
	copy(out, msg)
	copy(out[len(msg)+padded:], extra)
	a := out[len(msg):]
	binary.BigEndian.PutUint32(a[0:4], avp.RouteRecord)
	a[4] = avp.Mbit
	a[5], a[6], a[7] = byte(l>>16), byte(l>>8), byte(l)
	copy(a[8:], from)
	n := len(out)
	out[1], out[2], out[3] = byte(n>>16), byte(n>>8), byte(n)
	return out
}

// answerCopy copies an answer with its Hop-by-Hop id set back to hbh.
func answerCopy(msg []byte, hbh uint32) []byte {
	out := append([]byte(nil), msg...)
	setHopByHop(out, hbh)
	return out
}

// Application is one application the agent advertises and routes: its
// Application-Id, the Vendor-Id of a vendor-specific one (0: none), and
// whether it is an accounting application.
type Application struct {
	ID       uint32 `json:"id"`
	VendorID uint32 `json:"vendor_id,omitempty"`
	Acct     bool   `json:"acct,omitempty"`
}

// Identity is the agent's own: what its CER, CEA, DWR, DWA, DPR and its
// refusals carry.
type Identity struct {
	OriginHost      string
	OriginRealm     string
	HostIPAddresses []netip.Addr
	VendorID        uint32
	ProductName     string
	OriginStateID   uint32
}

// capabilities adds the CER/CEA AVPs after Origin-Host and Origin-Realm.
func (id *Identity) capabilities(m *diam.Message, apps []Application) {
	for _, ip := range id.HostIPAddresses {
		m.NewAVP(avp.HostIPAddress, avp.Mbit, 0, datatype.Address(ip.AsSlice()))
	}
	m.NewAVP(avp.VendorID, avp.Mbit, 0, datatype.Unsigned32(id.VendorID))
	m.NewAVP(avp.ProductName, 0, 0, datatype.UTF8String(id.ProductName))
	m.NewAVP(avp.OriginStateID, avp.Mbit, 0, datatype.Unsigned32(id.OriginStateID))
	vendors := map[uint32]bool{}
	for _, a := range apps {
		code := uint32(avp.AuthApplicationID)
		if a.Acct {
			code = avp.AcctApplicationID
		}
		if a.VendorID == 0 {
			m.NewAVP(code, avp.Mbit, 0, datatype.Unsigned32(a.ID))
			continue
		}
		if !vendors[a.VendorID] {
			vendors[a.VendorID] = true
			m.NewAVP(avp.SupportedVendorID, avp.Mbit, 0, datatype.Unsigned32(a.VendorID))
		}
		m.NewAVP(avp.VendorSpecificApplicationID, avp.Mbit, 0, &diam.GroupedAVP{AVP: []*diam.AVP{
			diam.NewAVP(avp.VendorID, avp.Mbit, 0, datatype.Unsigned32(a.VendorID)),
			diam.NewAVP(code, avp.Mbit, 0, datatype.Unsigned32(a.ID)),
		}})
	}
}

func (id *Identity) origin(m *diam.Message) {
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(id.OriginHost))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(id.OriginRealm))
}

// buildCER is the agent's CER to an upstream peer.
func buildCER(id *Identity, apps []Application, hbh uint32) ([]byte, error) {
	m := diam.NewMessage(cmdCER, diam.RequestFlag, 0, hbh, 0, dict.Default)
	id.origin(m)
	id.capabilities(m, apps)
	return m.Serialize()
}

// buildAnswer is the agent's answer to a base request (CEA, DWA, DPA) or a
// refusal of a routed one: same command, application and identifiers, the
// E bit for protocol errors (3xxx). A CEA carries the capabilities.
func buildAnswer(req *msgInfo, id *Identity, apps []Application, result uint32, errMsg string) ([]byte, error) {
	b, err := encodeAnswer(req, id, apps, result, errMsg)
	if err == nil {
		// go-diameter makes up an identifier of 0: the request's is kept.
		setHopByHop(b, req.hdr.HopByHopID)
		binary.BigEndian.PutUint32(b[16:20], req.hdr.EndToEndID)
	}
	return b, err
}

func encodeAnswer(req *msgInfo, id *Identity, apps []Application, result uint32, errMsg string) ([]byte, error) {
	h := &req.hdr
	if !req.base() {
		return diameter.Refusal(req.info(), result, id.OriginHost, id.OriginRealm, errMsg)
	}
	flags := h.CommandFlags &^ (diam.RequestFlag | diam.RetransmittedFlag)
	if result >= 3000 && result < 4000 {
		flags |= diam.ErrorFlag
	}
	m := diam.NewMessage(h.CommandCode, flags, 0, h.HopByHopID, h.EndToEndID, dict.Default)
	m.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(result))
	id.origin(m)
	if errMsg != "" {
		m.NewAVP(avp.ErrorMessage, 0, 0, datatype.UTF8String(errMsg))
	}
	switch h.CommandCode {
	case cmdCER:
		id.capabilities(m, apps)
	case cmdDWR:
		m.NewAVP(avp.OriginStateID, avp.Mbit, 0, datatype.Unsigned32(id.OriginStateID))
	}
	return m.Serialize()
}

// buildDWR and buildDPR are the agent's watchdog and disconnect requests.
func buildDWR(id *Identity, hbh uint32) ([]byte, error) {
	m := diam.NewMessage(cmdDWR, diam.RequestFlag, 0, hbh, 0, dict.Default)
	id.origin(m)
	m.NewAVP(avp.OriginStateID, avp.Mbit, 0, datatype.Unsigned32(id.OriginStateID))
	return m.Serialize()
}

func buildDPR(id *Identity, hbh uint32) ([]byte, error) {
	m := diam.NewMessage(cmdDPR, diam.RequestFlag, 0, hbh, 0, dict.Default)
	id.origin(m)
	m.NewAVP(avp.DisconnectCause, avp.Mbit, 0, datatype.Enumerated(0)) // REBOOTING
	return m.Serialize()
}
