package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// diameterStats is what a Diameter server peer saw, at GET /_diameter.
type diameterStats struct {
	Host     string         `json:"host"`
	Requests int            `json:"requests"` // besides CER, DWR, DPR
	ByType   map[string]int `json:"by_type"`  // gx-ccr-i, gy-ccr-u, …
	// Retransmitted are the requests that came with the T flag, by
	// Session-Id.
	Retransmitted map[string]int `json:"retransmitted"`
	DWR           int            `json:"dwr"`
	Connections   int            `json:"connections"` // accepted so far
}

// serveDiameter is a Diameter server (a PCRF or an OCS): it answers CER
// with its identity and Gx and Gy, DWR and DPR, and every other request
// with DIAMETER_SUCCESS, its Origin-Host and the request's Session-Id,
// after answerDelay.
func serveDiameter(addr, host, realm string, answerDelay time.Duration) {
	stats := diameterStats{Host: host, ByType: map[string]int{}, Retransmitted: map[string]int{}}
	var mu sync.Mutex
	http.HandleFunc("GET /_diameter", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		json.NewEncoder(w).Encode(stats)
	})
	http.HandleFunc("POST /_avps", setExtraAVPs)
	http.HandleFunc("POST /_rar", func(w http.ResponseWriter, r *http.Request) {
		res, err := sendRAR(host, realm, r.URL.Query().Get("dest"), r.URL.Query().Get("session"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		json.NewEncoder(w).Encode(res)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("testpeer %s: Diameter on %s", host, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				log.Fatal(err)
			}
			mu.Lock()
			stats.Connections++
			mu.Unlock()
			go serveDiameterConn(c, host, realm, answerDelay, func(in diameter.Info) {
				mu.Lock()
				defer mu.Unlock()
				if in.Header.CommandCode == diameter.CmdDeviceWatchdog {
					stats.DWR++
					return
				}
				stats.Requests++
				stats.ByType[in.Type()]++
				if in.Header.CommandFlags&diam.RetransmittedFlag != 0 {
					stats.Retransmitted[in.SessionID]++
				}
			})
		}
	}()
}

func serveDiameterConn(c net.Conn, host, realm string, delay time.Duration, seen func(diameter.Info)) {
	defer c.Close()
	r := bufio.NewReader(c)
	var wmu sync.Mutex
	write := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		c.Write(b)
	}
	rars.mu.Lock()
	rars.write = write // server-initiated requests go on the newest connection
	rars.mu.Unlock()
	for {
		msg, h, err := diameter.ReadMessage(r, 1<<20)
		if err != nil {
			return
		}
		in, err := diameter.Classify(msg, h)
		if err != nil {
			continue
		}
		if !in.Request {
			rars.answered(h.HopByHopID, msg)
			continue
		}
		if !in.Base() || h.CommandCode == diameter.CmdDeviceWatchdog {
			seen(in)
		}
		ans, err := diameter.Refusal(in, diam.Success, host, realm, "")
		if err != nil {
			log.Printf("answer: %v", err)
			return
		}
		if !in.Base() {
			ans = extra.appendTo(ans)
		}
		switch {
		case h.CommandCode == diameter.CmdCapabilitiesExchange:
			write(cea(in, host, realm))
		case h.CommandCode == diameter.CmdDisconnectPeer:
			write(ans)
			return
		case delay > 0 && !in.Base():
			go func() { time.Sleep(delay); write(ans) }()
		default:
			write(ans)
		}
	}
}

// cea answers a CER with the server's identity and Gx and Gy.
func cea(in diameter.Info, host, realm string) []byte {
	h := in.Header
	m := diam.NewMessage(h.CommandCode, 0, 0, h.HopByHopID, h.EndToEndID, dict.Default)
	m.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(diam.Success))
	diameter.AddCapabilities(m, host, realm, "edgesteer testpeer")
	b, err := m.Serialize()
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// rars are the server's own requests (RAR) awaiting their answer.
var rars rarTable

type rarTable struct {
	mu    sync.Mutex
	write func([]byte)
	next  uint32
	wait  map[uint32]chan []byte
}

func (r *rarTable) answered(hbh uint32, msg []byte) {
	r.mu.Lock()
	ch := r.wait[hbh]
	delete(r.wait, hbh)
	r.mu.Unlock()
	if ch != nil {
		ch <- append([]byte(nil), msg...)
	}
}

// rarResult is the answer to a RAR, at POST /_rar.
type rarResult struct {
	ResultCode uint32 `json:"result_code"`
	OriginHost string `json:"origin_host"`
}

// sendRAR sends a Gx Re-Auth-Request to the downstream peer dest through
// the agent connected last, and waits 5 s at most for its answer.
func sendRAR(host, realm, dest, session string) (rarResult, error) {
	rars.mu.Lock()
	write := rars.write
	rars.next++
	hbh := rars.next
	ch := make(chan []byte, 1)
	if rars.wait == nil {
		rars.wait = map[uint32]chan []byte{}
	}
	rars.wait[hbh] = ch
	rars.mu.Unlock()
	if write == nil {
		return rarResult{}, fmt.Errorf("no Diameter connection")
	}
	m := diam.NewMessage(258, diam.RequestFlag|diam.ProxiableFlag, diameter.AppGx, hbh, hbh, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(session))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(host))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(realm))
	m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity("pgw.example"))
	m.NewAVP(avp.DestinationHost, avp.Mbit, 0, datatype.DiameterIdentity(dest))
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGx))
	m.NewAVP(avp.ReAuthRequestType, avp.Mbit, 0, datatype.Enumerated(0))
	b, err := m.Serialize()
	if err != nil {
		return rarResult{}, err
	}
	write(b)
	select {
	case a := <-ch:
		am, err := diam.ReadMessage(bytes.NewReader(a), dict.Default)
		if err != nil {
			return rarResult{}, err
		}
		var res rarResult
		if v, err := am.FindAVP(avp.ResultCode, 0); err == nil {
			res.ResultCode = uint32(v.Data.(datatype.Unsigned32))
		}
		if v, err := am.FindAVP(avp.OriginHost, 0); err == nil {
			res.OriginHost = string(v.Data.(datatype.DiameterIdentity))
		}
		return res, nil
	case <-time.After(5 * time.Second):
		return rarResult{}, fmt.Errorf("no RAA in 5s")
	}
}
