package peerratelimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// DiameterMode makes the layer4 handler frame Diameter messages in both
// directions and limit each request: its type (gx-ccr-i, gy-ccr-t, cer, …)
// selects the profile's message limit, and its Origin-Host is the peer
// unless the profile names a peer placeholder. A rejected request is
// answered to its sender with ResultCode; a dropped one vanishes. CER/CEA,
// DWR/DWA and DPR/DPA always pass.
type DiameterMode struct {
	// OriginHost and OriginRealm of the answers the proxy writes itself.
	OriginHost  string `json:"origin_host"`
	OriginRealm string `json:"origin_realm"`
	// ResultCode of a rejection: default 3002 (DIAMETER_TOO_BUSY); e.g. 3004.
	ResultCode uint32 `json:"result_code,omitempty"`
	// ErrorMessage of a rejection: default "rate limit exceeded".
	ErrorMessage string `json:"error_message,omitempty"`
	// MaxLength of a client message; longer ones close the connection.
	// Default 65536.
	MaxLength int `json:"max_length,omitempty"`
}

func (m *DiameterMode) validate() error {
	switch {
	case m.OriginHost == "" || m.OriginRealm == "":
		return fmt.Errorf("peer_rate_limit: diameter: origin_host and origin_realm are required (answers carry them)")
	case m.ResultCode != 0 && (m.ResultCode < 1000 || m.ResultCode > 5999):
		return fmt.Errorf("peer_rate_limit: diameter: result_code %d: want a Diameter result code, 1000-5999", m.ResultCode)
	case m.MaxLength < 0 || (m.MaxLength > 0 && m.MaxLength < 20) || m.MaxLength > 1<<24:
		return fmt.Errorf("peer_rate_limit: diameter: max_length %d: want 20 to 16777216", m.MaxLength)
	}
	if m.ResultCode == 0 {
		m.ResultCode = diameter.ResultTooBusy
	}
	if m.ErrorMessage == "" {
		m.ErrorMessage = "rate limit exceeded"
	}
	if m.MaxLength == 0 {
		m.MaxLength = diameter.DefaultMaxLength
	}
	return nil
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
	dc := &diameterConn{
		Conn: cx, h: h, cx: cx, addr: addr,
		in:  bufio.NewReader(io.MultiReader(bytes.NewReader(pre), cx)),
		out: &boundaryWriter{w: cx},
	}
	return next.Handle(cx.Wrap(dc))
}

type addrOf = func() string

type diameterConn struct {
	net.Conn
	h       *L4Handler
	cx      *layer4.Connection
	addr    addrOf
	in      *bufio.Reader
	out     *boundaryWriter
	pending []byte // admitted bytes not yet read
}

// Read returns admitted client messages.
func (c *diameterConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		msg, hdr, err := diameter.ReadMessage(c.in, c.h.Diameter.MaxLength)
		if err == nil {
			var in diameter.Info
			if in, err = diameter.Classify(msg, hdr); err == nil {
				if c.admit(in, msg) {
					c.pending = msg
				}
				continue
			}
		}
		if errors.Is(err, diameter.ErrMalformed) {
			c.cx.Logger.Warn("malformed Diameter message: closing this connection",
				zap.String("remote", c.cx.RemoteAddr().String()), zap.Error(err))
		}
		return 0, err
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// admit decides one message; a refusal is written back here.
func (c *diameterConn) admit(in diameter.Info, msg []byte) bool {
	if !in.Request || in.Base() {
		return true
	}
	h := c.h.current()
	p := h.profileFor(c.cx)
	if p == nil {
		return true
	}
	key := in.OriginHost
	if p.cfg.Peer != "" {
		key = c.cx.Replacer().ReplaceAll(p.cfg.Peer, "")
	} else if key == "" {
		key = c.addr()
	}
	typ := in.Type()
	idx, msgType := 0, ""
	if i := slices.IndexFunc(p.cfg.Messages, func(m MessageConfig) bool { return m.Type == typ }); i >= 0 {
		idx, msgType = i+1, typ
	}
	verdict, _ := p.decide(key, idx, msgType, c.cx.Replacer(), l4Placeholders)
	switch verdict {
	case admitted:
		return true
	case rejected:
		m := h.Diameter
		ans, err := diameter.Refusal(in, m.ResultCode, m.OriginHost, m.OriginRealm, m.ErrorMessage)
		if err == nil {
			err = c.out.inject(ans)
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
	if g := h.lease.sh.newest(); g != nil {
		if nh, ok := g.handler.(*L4Handler); ok && nh.Diameter != nil {
			return nh
		}
	}
	return h
}

// Write passes the upstream's bytes on, tracking message boundaries.
func (c *diameterConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// boundaryWriter writes the upstream's answers to the client and slips the
// proxy's own answers in only between whole messages.
type boundaryWriter struct {
	mu        sync.Mutex
	w         io.Writer
	hdr       [20]byte
	hdrN      int  // header bytes seen of the current message
	remaining int  // body bytes left of the current message
	broken    bool // the upstream's stream did not parse: stop waiting for boundaries
	queue     [][]byte
}

func (b *boundaryWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.w.Write(p)
	b.advance(p[:n])
	if err == nil && b.atBoundary() {
		for len(b.queue) > 0 && err == nil {
			_, err = b.w.Write(b.queue[0])
			b.queue = b.queue[1:]
		}
	}
	return n, err
}

func (b *boundaryWriter) inject(msg []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.atBoundary() {
		_, err := b.w.Write(msg)
		return err
	}
	b.queue = append(b.queue, msg)
	return nil
}

func (b *boundaryWriter) atBoundary() bool { return b.broken || (b.remaining == 0 && b.hdrN == 0) }

func (b *boundaryWriter) advance(p []byte) {
	for len(p) > 0 && !b.broken {
		if b.remaining > 0 {
			k := min(b.remaining, len(p))
			b.remaining -= k
			p = p[k:]
			continue
		}
		k := copy(b.hdr[b.hdrN:], p)
		b.hdrN += k
		p = p[k:]
		if b.hdrN == len(b.hdr) {
			h, err := diameter.ParseHeader(b.hdr[:], 1<<24)
			if err != nil {
				b.broken = true
				return
			}
			b.remaining, b.hdrN = int(h.MessageLength)-len(b.hdr), 0
		}
	}
}

func unmarshalDiameter(d *caddyfile.Dispenser) (*DiameterMode, error) {
	m := &DiameterMode{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var v string
		if !d.Args(&v) || d.NextArg() {
			return nil, d.ArgErr()
		}
		switch opt {
		case "origin_host":
			m.OriginHost = v
		case "origin_realm":
			m.OriginRealm = v
		case "error_message":
			m.ErrorMessage = v
		case "result_code", "max_length":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return nil, d.Errf("peer_rate_limit: diameter %s %q: not a number", opt, v)
			}
			if opt == "result_code" {
				m.ResultCode = uint32(n)
			} else {
				m.MaxLength = n
			}
		default:
			return nil, d.Errf("peer_rate_limit: diameter: unknown option %q", opt)
		}
	}
	return m, nil
}
