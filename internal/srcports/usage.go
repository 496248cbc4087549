package srcports

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
)

// Usage is how much of a range the host's TCP sockets hold: the pressure
// that limits new connections per second from a range (a port in
// TIME_WAIT toward a destination cannot be reused toward it).
type Usage struct {
	InUse    int // sockets, in any state but LISTEN, with a local port in the range
	TimeWait int // of which in TIME_WAIT
}

// TCP states in /proc/net/tcp.
const (
	stateTimeWait = 0x06
	stateListen   = 0x0A
)

// CountUsage adds to u the sockets of one /proc/net/tcp-format table
// (header line, then "sl local_address rem_address st ..." with
// hexadecimal address:port and state) whose local port is in r.
func (r Range) CountUsage(u *Usage, table io.Reader) error {
	sc := bufio.NewScanner(table)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		port, err1 := strconv.ParseUint(f[1][i+1:], 16, 16)
		st, err2 := strconv.ParseUint(f[3], 16, 8)
		if err1 != nil || err2 != nil || !r.Contains(uint16(port)) || st == stateListen {
			continue
		}
		u.InUse++
		if st == stateTimeWait {
			u.TimeWait++
		}
	}
	return sc.Err()
}

// HostUsage counts the sockets of this host (its network namespace), IPv4
// and IPv6, with a local port in r. It reads /proc and is meant for an
// admin view, not a request path.
func (r Range) HostUsage() (Usage, error) {
	var u Usage
	var errs []error
	for _, p := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		errs = append(errs, r.CountUsage(&u, f))
		f.Close()
	}
	return u, errors.Join(errs...)
}
