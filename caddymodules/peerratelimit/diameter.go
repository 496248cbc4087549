package peerratelimit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/diameter"
)

// DiameterMode makes the layer4 handler frame Diameter messages in both
// directions and limit each request: its type (gx-ccr-i, gy-ccr-t, cer, …)
// selects the profile's message limit, and the peer is the Origin-Host of
// the connection's CER (before a CER, the remote address) unless the
// profile names a peer placeholder. A rejected request is
// answered to its sender with ResultCode; a dropped one vanishes. CER/CEA,
// DWR/DWA and DPR/DPA always pass.
type DiameterMode struct {
	// OriginHost and OriginRealm of the answers the proxy writes itself.
	OriginHost  string `json:"origin_host"`
	OriginRealm string `json:"origin_realm"`
	// ResultCode of a rejection: default 3002 (DIAMETER_UNABLE_TO_DELIVER);
	// e.g. 3004 (DIAMETER_TOO_BUSY).
	ResultCode uint32 `json:"result_code,omitempty"`
	// ErrorMessage of a rejection: default "rate limit exceeded".
	ErrorMessage string `json:"error_message,omitempty"`
	// MaxLength of a client message; longer ones close the connection.
	// Default 65536.
	MaxLength int `json:"max_length,omitempty"`
	// MaxQueuedRefusals bounds the refusals of one connection that wait
	// for the end of the upstream's message in progress (default 256);
	// past it a refusal is discarded, as if dropped, and counted.
	MaxQueuedRefusals int `json:"max_queued_refusals,omitempty"`
	// RefusalWait is how long a refusal may wait for the end of the
	// upstream's message in progress (default 5s). Then the upstream is
	// taken to have stalled inside a message: the waiting refusals are
	// discarded and counted, and the client connection is closed.
	RefusalWait caddy.Duration `json:"refusal_wait,omitempty"`
}

// Defaults of the refusal queue.
const (
	defaultMaxQueuedRefusals = 256
	defaultRefusalWait       = 5 * time.Second
)

// validate checks the mode as configured (a zero field takes its default
// later, in fillDefaults).
func (m *DiameterMode) validate() error {
	switch {
	case m.OriginHost == "" || m.OriginRealm == "":
		return fmt.Errorf("peer_rate_limit: diameter: origin_host and origin_realm are required (answers carry them)")
	case m.ResultCode != 0 && (m.ResultCode < 1000 || m.ResultCode > 5999):
		return fmt.Errorf("peer_rate_limit: diameter: result_code %d: want a Diameter result code, 1000-5999", m.ResultCode)
	case m.MaxLength < 0 || (m.MaxLength > 0 && m.MaxLength < 20) || m.MaxLength > 1<<24:
		return fmt.Errorf("peer_rate_limit: diameter: max_length %d: want 20 to 16777216", m.MaxLength)
	case m.MaxQueuedRefusals < 0 || m.MaxQueuedRefusals > 1<<16:
		return fmt.Errorf("peer_rate_limit: diameter: max_queued_refusals %d: want 1 to 65536", m.MaxQueuedRefusals)
	case m.RefusalWait < 0:
		return fmt.Errorf("peer_rate_limit: diameter: refusal_wait %v: must be positive", time.Duration(m.RefusalWait))
	}
	return nil
}

// fillDefaults gives every field left zero its default.
func (m *DiameterMode) fillDefaults() {
	if m.MaxQueuedRefusals == 0 {
		m.MaxQueuedRefusals = defaultMaxQueuedRefusals
	}
	if m.RefusalWait == 0 {
		m.RefusalWait = caddy.Duration(defaultRefusalWait)
	}
	if m.ResultCode == 0 {
		m.ResultCode = diameter.ResultUnableToDeliver
	}
	if m.ErrorMessage == "" {
		m.ErrorMessage = "rate limit exceeded"
	}
	if m.MaxLength == 0 {
		m.MaxLength = diameter.DefaultMaxLength
	}
}

// handleDiameter wraps the connection so that the next handler (the proxy)
// reads only admitted requests and writes answers that never interleave
// with the refusals written here.
func (h *L4Handler) handleDiameter(cx *layer4.Connection, next layer4.Handler, addr addrOf) error {
	// Take over the bytes prefetched while matching, so every message,
	// the first included, passes through the framer.
	pre := make([]byte, len(cx.MatchingBytes()))
	if _, err := io.ReadFull(cx, pre); err != nil {
		return err
	}
	remote := zap.String("remote", cx.RemoteAddr().String())
	out := &diameter.BoundaryWriter{
		W: cx,
		// The upstream stopped inside a message: nothing more can be
		// written to the client without breaking its stream, so end the
		// connection and let the client fail over at once, instead of
		// after its watchdog gives up.
		Stall: func(discarded int, waited time.Duration) {
			cx.Logger.Warn("Diameter upstream stalled inside a message: closing the client connection",
				remote, zap.Int("refusals_discarded", discarded), zap.Duration("waited", waited))
			cx.Close()
		},
		Overflow: func() {
			cx.Logger.Warn("Diameter refusals discarded: too many wait for the upstream's message in progress",
				remote, zap.Int("max_queued_refusals", h.current().Diameter.MaxQueuedRefusals))
		},
	}
	dc := &diameterConn{
		Conn: cx, h: h, cx: cx, addr: addr,
		in:  diameter.NewFramer(io.MultiReader(bytes.NewReader(pre), cx), 0, h.Diameter.MaxLength),
		out: out,
	}
	return next.Handle(cx.Wrap(dc))
}

type addrOf = func() string

type diameterConn struct {
	net.Conn
	h       *L4Handler
	cx      *layer4.Connection
	addr    addrOf
	in      *diameter.Framer
	out     *diameter.BoundaryWriter
	pending []byte // admitted bytes not yet read (in the framer's buffer)
	info    diameter.Info
	err     error // to return once the bytes before it are read

	// the placeholder values last set: set again only when they change
	// (a Set boxes the string: an allocation per message otherwise)
	setOrigin, setCER string
	placeholdersSet   bool

	// identity is the Origin-Host of the connection's CER: the peer the
	// connection was negotiated for, and so the key of its requests.
	// Before a CER it is empty and the remote address is the key.
	identity string
	// mismatchLogged: a request's Origin-Host differed from identity
	// (logged once per connection, counted every time).
	mismatchLogged bool
}

// originHostPlaceholder is each request's own Origin-Host, e.g. for a
// profile's peer (peer {l4.peer_rate_limit.origin_host}).
const originHostPlaceholder = "l4.peer_rate_limit.origin_host"

// cerOriginHostPlaceholder is the Origin-Host of the connection's CER (empty
// before one), the identity a peer cannot change per request: the one to
// select a profile by (select {l4.peer_rate_limit.cer_origin_host} …).
const cerOriginHostPlaceholder = "l4.peer_rate_limit.cer_origin_host"

// Read returns admitted client messages: as many whole messages as the
// framer has buffered and p holds (so the proxy forwards a burst of
// messages in one write, as a plain proxy forwards what it read), the
// last one maybe in part (its rest at the next Read). It blocks on the
// client only when it has nothing to return yet.
func (c *diameterConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n := 0
	for {
		if len(c.pending) > 0 {
			k := copy(p[n:], c.pending)
			c.pending = c.pending[k:]
			n += k
			if len(c.pending) > 0 || n == len(p) {
				return n, nil
			}
		}
		if n > 0 && !c.in.Ready() {
			return n, nil
		}
		msg, err := c.in.Next()
		if err == nil {
			if err = c.info.Parse(msg); err == nil {
				if c.admit(&c.info) {
					c.pending = msg
				}
				continue
			}
		}
		if errors.Is(err, diameter.ErrMalformed) {
			c.cx.Logger.Warn("malformed Diameter message: closing this connection",
				zap.String("remote", c.cx.RemoteAddr().String()), zap.Error(err))
		}
		if n > 0 {
			c.err = err // the messages before it go first
			return n, nil
		}
		return 0, err
	}
}

// admit decides one message; a refusal is written back here.
//
// A request is keyed by the identity the connection's CER negotiated, not
// by its own Origin-Host: a peer that writes another Origin-Host into each
// request would otherwise get a fresh bucket every time.
func (c *diameterConn) admit(in *diameter.Info) bool {
	if in.Request && in.Base() && in.Header.CommandCode == diameter.CmdCapabilitiesExchange && c.identity == "" {
		c.identity = in.OriginHost // a repeated CER changes nothing
	}
	if !in.Request || in.Base() {
		return true
	}
	h := c.h.current()
	repl := c.cx.Replacer()
	if !c.placeholdersSet || c.setOrigin != in.OriginHost || c.setCER != c.identity {
		c.placeholdersSet, c.setOrigin, c.setCER = true, in.OriginHost, c.identity
		repl.Set(originHostPlaceholder, in.OriginHost)
		repl.Set(cerOriginHostPlaceholder, c.identity)
	}
	if c.identity != "" && in.OriginHost != c.identity {
		h.originMismatch.Inc()
		if !c.mismatchLogged {
			c.mismatchLogged = true
			c.cx.Logger.Warn("Diameter request's Origin-Host differs from the connection's CER: limited as the CER's peer",
				zap.String("remote", c.cx.RemoteAddr().String()), zap.String("cer_origin_host", c.identity),
				zap.String("origin_host", in.OriginHost))
		}
	}
	p := h.profileFor(c.cx)
	if p == nil {
		return true
	}
	fallback := c.identity
	if fallback == "" {
		fallback = c.addr()
	}
	typ := in.Type()
	idx, msgType := 0, ""
	if i := slices.IndexFunc(p.cfg.Messages, func(m MessageConfig) bool { return m.Type == typ }); i >= 0 {
		idx, msgType = i+1, typ
	}
	var verdict int
	if key, ok := p.peerKey(repl, fallback); ok {
		verdict, _ = p.decide(key, idx, msgType, repl, l4Placeholders)
	} else {
		verdict = p.refuseUnnamed(idx, repl, l4Placeholders)
	}
	switch verdict {
	case admitted:
		return true
	case rejected:
		m := h.Diameter
		ans, err := diameter.Refusal(*in, m.ResultCode, m.OriginHost, m.OriginRealm, m.ErrorMessage)
		if err == nil {
			_, err = c.out.Inject(ans, h.queue)
		}
		if err != nil {
			c.cx.Logger.Warn("writing a Diameter refusal", zap.Error(err))
		}
	}
	return false
}

// current returns the newest provisioned Diameter-mode handler of h's name:
// a connection outlives config reloads, and from its next message on it
// follows the limits of the config in force (the buckets are the same).
// If the name has gone from the config, the connection keeps h's limits.
func (h *L4Handler) current() *L4Handler {
	if h.lease == nil {
		return h
	}
	if g := h.lease.hs.newest(); g != nil {
		if nh, ok := g.handler.(*L4Handler); ok && nh.Diameter != nil {
			return nh
		}
	}
	return h
}

// Write passes the upstream's bytes on, tracking message boundaries.
func (c *diameterConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// unmarshalDiameter reads, at the handler's "diameter" option, the block
// documented at L4Handler.UnmarshalCaddyfile; the block and each of its
// options are given once. Ranges beyond the syntax are Validate's.
func unmarshalDiameter(o *cfparse.Block) (*DiameterMode, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	if _, err := o.BlockArgs(0, 0); err != nil {
		return nil, err
	}
	m := &DiameterMode{}
	for sub := o.Sub(); sub.Next(); {
		var err error
		switch sub.Name() {
		case "origin_host":
			m.OriginHost, err = sub.String()
		case "origin_realm":
			m.OriginRealm, err = sub.String()
		case "error_message":
			m.ErrorMessage, err = sub.String()
		case "refusal_wait":
			m.RefusalWait, err = sub.Duration(time.Nanosecond)
		case "result_code":
			var n int
			n, err = sub.Int(0, math.MaxUint32)
			m.ResultCode = uint32(n)
		case "max_length":
			m.MaxLength, err = sub.Int(0, math.MaxInt)
		case "max_queued_refusals":
			m.MaxQueuedRefusals, err = sub.Int(0, math.MaxInt)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}
