package gatewaysel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"syscall"
)

// Probe failure reasons: a small fixed set, so they can label metrics.
const (
	ReasonTimeout     = "timeout"     // no answer within the probe's time
	ReasonRefused     = "refused"     // connection refused: nothing listens
	ReasonReset       = "reset"       // connection reset or closed mid-exchange
	ReasonUnreachable = "unreachable" // no route, host or network unreachable
	ReasonTLS         = "tls"         // TLS handshake or certificate failed
	ReasonProtocol    = "protocol"    // the peer does not speak the probe's protocol (e.g. plain HTTP to an https probe)
	ReasonHTTPStatus  = "http_status" // an HTTP answer with status 500 or above
	ReasonCanceled    = "canceled"    // the probe run ended first (deadline or shutdown)
	ReasonOther       = "other"
)

// Reasons lists every reason Reason returns.
var Reasons = []string{ReasonTimeout, ReasonRefused, ReasonReset, ReasonUnreachable, ReasonTLS, ReasonProtocol, ReasonHTTPStatus, ReasonCanceled, ReasonOther}

// Reason classifies a probe error into one of Reasons ("" for nil).
func Reason(err error) string {
	if err == nil {
		return ""
	}
	var cert *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var recordHdr tls.RecordHeaderError
	var alert tls.AlertError
	var netErr net.Error
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ReasonReset
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EADDRNOTAVAIL):
		return ReasonUnreachable
	case errors.As(err, &recordHdr), strings.Contains(msg, "server gave HTTP response to HTTPS client"), strings.Contains(msg, "malformed HTTP"):
		return ReasonProtocol
	case errors.As(err, &cert), errors.As(err, &unknownAuth), errors.As(err, &hostname), errors.As(err, &alert), strings.Contains(msg, "tls: "):
		return ReasonTLS
	case strings.HasPrefix(msg, "probe answered "):
		return ReasonHTTPStatus
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return ReasonTimeout
	case errors.Is(err, context.Canceled):
		return ReasonCanceled
	case strings.Contains(msg, "EOF"), strings.Contains(msg, "connection reset"), strings.Contains(msg, "server closed idle connection"):
		// Go's HTTP client reports a peer closing before the answer either
		// way, depending on when the close is seen.
		return ReasonReset
	}
	return ReasonOther
}
