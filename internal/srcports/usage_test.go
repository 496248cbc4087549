package srcports

import (
	"net"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func TestCountUsage(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0BB9 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:0BBA 0100007F:1F90 06 00000000:00000000 03:00000A1B 00000000     0        0 0 3 0000000000000000
   3: 0100007F:1F90 0100007F:0BB9 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
garbage
`
	var u Usage
	if err := (Range{Lo: 3000, Hi: 3010}).CountUsage(&u, strings.NewReader(table)); err != nil {
		t.Fatal(err)
	}
	// 0x0BB8 = 3000 listens (not counted); 3001 established, 3002 TIME_WAIT; 0x1F90 = 8080 is outside.
	if u != (Usage{InUse: 2, TimeWait: 1}) {
		t.Fatalf("%+v", u)
	}
}

// HostUsage sees a real connection from a port of the range.
func TestHostUsage(t *testing.T) {
	addr, _ := e2e.HangingListener(t, "127.0.0.1:0")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	u, err := (Range{Lo: p, Hi: p}).HostUsage()
	if err != nil {
		t.Fatal(err)
	}
	if u.InUse < 1 {
		t.Fatalf("port %d: %+v", p, u)
	}
}
