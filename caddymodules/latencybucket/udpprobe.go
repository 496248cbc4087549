package latencybucket

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/latency"
)

// UDPProbe measures the layer4 proxy's UDP upstreams (udp/host:port),
// which a TCP, TLS or HTTP probe cannot reach: either a TCP connect to a
// port of the same host (TCPPort), or a request datagram and its answer.
// Exactly one of TCPPort and a request is given.
type UDPProbe struct {
	// TCPPort: time a TCP connect to this port of the UDP upstream's host.
	TCPPort int `json:"tcp_port,omitempty"`
	// Request is sent in one datagram (text; RequestHex for bytes); the
	// probe is timed until an answer whose first bytes are Answer (or
	// AnswerHex) arrives, any answer if neither is given. At most 1024
	// bytes of request and 512 of answer.
	Request    string `json:"request,omitempty"`
	RequestHex string `json:"request_hex,omitempty"`
	Answer     string `json:"answer,omitempty"`
	AnswerHex  string `json:"answer_hex,omitempty"`
}

// prober checks the probe and builds it, naming the bad option and value.
func (u *UDPProbe) prober() (latency.Prober, error) {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("latency_bucket: udp_probe %s %v: %s", opt, v, why)
	}
	hasRequest := u.Request != "" || u.RequestHex != ""
	switch {
	case u.TCPPort != 0 && (hasRequest || u.Answer != "" || u.AnswerHex != ""):
		return nil, bad("tcp", u.TCPPort, "give a TCP port or a request and answer, not both")
	case u.TCPPort != 0:
		if u.TCPPort < 1 || u.TCPPort > 65535 {
			return nil, bad("tcp", u.TCPPort, "want a port from 1 to 65535")
		}
		return latency.PortProber{Port: u.TCPPort}, nil
	case !hasRequest:
		return nil, errors.New("latency_bucket: udp_probe: give tcp <port>, or udp <request> [<answer>]")
	case u.Request != "" && u.RequestHex != "":
		return nil, bad("request", strconv.Quote(u.Request), "give request or request_hex, not both")
	case u.Answer != "" && u.AnswerHex != "":
		return nil, bad("answer", strconv.Quote(u.Answer), "give answer or answer_hex, not both")
	}
	req, err := payload("request", u.Request, u.RequestHex, latency.MaxUDPRequest)
	if err != nil {
		return nil, err
	}
	ans, err := payload("answer", u.Answer, u.AnswerHex, latency.MaxUDPAnswer)
	if err != nil {
		return nil, err
	}
	return latency.UDPProber{Request: req, Answer: ans}, nil
}

// payload decodes text or hex, at most max bytes.
func payload(opt, text, hx string, max int) ([]byte, error) {
	b := []byte(text)
	if hx != "" {
		var err error
		if b, err = hex.DecodeString(hx); err != nil {
			return nil, fmt.Errorf("latency_bucket: udp_probe %s_hex %q: not hexadecimal: %v", opt, hx, err)
		}
		opt += "_hex"
	}
	if len(b) > max {
		return nil, fmt.Errorf("latency_bucket: udp_probe %s (%d bytes): at most %d bytes", opt, len(b), max)
	}
	return b, nil
}

// checkUDPUpstreams refuses UDP upstreams without a udp_probe: they could
// be neither measured nor pinned.
func (c *Config) checkUDPUpstreams(addrs []string) error {
	if c.UDPProbe != nil {
		return nil
	}
	for _, a := range addrs {
		if strings.HasPrefix(a, latency.UDPPrefix) {
			return fmt.Errorf("latency_bucket: upstream %s: a UDP upstream needs udp_probe tcp <port> or udp_probe udp <request> [<answer>]", a)
		}
	}
	return nil
}

// unmarshalUDPProbe reads "udp_probe tcp <port>", "udp_probe udp
// <request> [<answer>]" or "udp_probe udp_hex <request> [<answer>]".
func (c *Config) unmarshalUDPProbe(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(2, 3)
	if err != nil {
		return err
	}
	u := &UDPProbe{}
	switch args[0] {
	case "tcp":
		if len(args) != 2 {
			return o.Errf("tcp takes one port, got %s", strings.Join(args[1:], " "))
		}
		if u.TCPPort, err = o.ParseInt(args[1], 1, 65535); err != nil {
			return err
		}
	case "udp":
		u.Request = args[1]
		if len(args) == 3 {
			u.Answer = args[2]
		}
	case "udp_hex":
		u.RequestHex = args[1]
		if len(args) == 3 {
			u.AnswerHex = args[2]
		}
	default:
		return o.Invalid(args[0], errors.New("want tcp, udp or udp_hex"))
	}
	if _, err := u.prober(); err != nil {
		return o.Dispenser().Err(err.Error())
	}
	c.UDPProbe = u
	return nil
}
