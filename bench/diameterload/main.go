// Command diameterload measures Diameter messages per second through a
// proxy, with go-diameter encoding on both ends.
//
//	diameterload -serve 127.0.0.1:3869            # answer every request with 2001
//	diameterload -target 127.0.0.1:3868 -d 5s     # CER, then pipelined CCR-U; prints msgs/s
//
// Only answers with Result-Code 2001 (DIAMETER_SUCCESS) count; any other
// answer, or one without a Result-Code, makes the run fail unless
// -allow-refusals is given (a benchmark that means to measure refusals).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

func main() {
	serve := flag.String("serve", "", "serve as the upstream peer on this address")
	target := flag.String("target", "", "proxy to load")
	dur := flag.Duration("d", 5*time.Second, "load duration")
	window := flag.Int("window", 64, "requests in flight")
	allowRefusals := flag.Bool("allow-refusals", false, "count answers other than 2001 instead of failing")
	flag.Parse()
	switch {
	case *serve != "":
		log.Fatal(runServer(*serve))
	case *target != "":
		n, other, err := runClient(*target, *dur, *window)
		if err != nil {
			log.Fatal(err)
		}
		if other > 0 && !*allowRefusals {
			log.Fatalf("%d answers were not DIAMETER_SUCCESS (2001) beside %d that were", other, n)
		}
		fmt.Printf("%.0f\n", float64(n)/dur.Seconds())
	default:
		flag.Usage()
	}
}

func runServer(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			for {
				m, err := diam.ReadMessage(conn, dict.Default)
				if err != nil {
					return
				}
				a := m.Answer(diam.Success)
				a.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("peer.example"))
				a.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
				if _, err := a.WriteTo(conn); err != nil {
					return
				}
			}
		}()
	}
}

func request(cmd, app, reqType, hbh uint32) []byte {
	b, err := diameter.Request(cmd, app, reqType, hbh, hbh, fmt.Sprint("load;", hbh), "pgw1.example", "example")
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// runClient keeps window CCR-U requests in flight for d and returns the
// answers received with Result-Code 2001 and those with any other.
func runClient(addr string, d time.Duration, window int) (success, other int64, err error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if _, err := conn.Write(request(257, 0, 0, 1)); err != nil {
		return 0, 0, err
	}
	if cea, err := diam.ReadMessage(conn, dict.Default); err != nil {
		return 0, 0, fmt.Errorf("CEA: %v", err)
	} else if rc := resultCode(cea); rc != diam.Success {
		return 0, 0, fmt.Errorf("CEA: Result-Code %d", rc)
	}
	msg := request(272, 16777238, 2, 2)
	slots := make(chan struct{}, window)
	var answered, refused atomic.Int64
	var counting atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := diam.ReadMessage(conn, dict.Default)
			if err != nil {
				return
			}
			switch {
			case resultCode(m) != diam.Success:
				refused.Add(1) // counted during the warm-up too: any refusal is a finding
			case counting.Load():
				answered.Add(1)
			}
			<-slots
		}
	}()
	end := time.Now().Add(d + time.Second)
	counting.Store(false)
	go func() { time.Sleep(time.Second); counting.Store(true) }() // 1 s warm-up
	for time.Now().Before(end) {
		slots <- struct{}{}
		if _, err := conn.Write(msg); err != nil {
			return 0, 0, err
		}
	}
	counting.Store(false)
	n := answered.Load()
	conn.Close()
	wg.Wait()
	return n, refused.Load(), nil
}

// resultCode is m's Result-Code, or 0 when it has none.
func resultCode(m *diam.Message) uint32 {
	a, err := m.FindAVP(avp.ResultCode, 0)
	if err != nil {
		return 0
	}
	if v, ok := a.Data.(datatype.Unsigned32); ok {
		return uint32(v)
	}
	return 0
}
