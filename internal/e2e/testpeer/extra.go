package main

import (
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// extra are encoded AVPs the server appends to its application answers
// (DOIC's OC-OLR, RFC 8583's Load, or bad ones), set by POST
// /_avps?hex=<AVPs>&for=<duration> (for: until then only; default always).
var extra extraAVPs

type extraAVPs struct {
	mu    sync.Mutex
	avps  []byte
	until time.Time
}

func setExtraAVPs(w http.ResponseWriter, r *http.Request) {
	b, err := hex.DecodeString(r.URL.Query().Get("hex"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var until time.Time
	if f := r.URL.Query().Get("for"); f != "" {
		d, err := time.ParseDuration(f)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		until = time.Now().Add(d)
	}
	extra.mu.Lock()
	extra.avps, extra.until = b, until
	extra.mu.Unlock()
}

// appendTo returns ans with the extra AVPs and its length fixed.
func (e *extraAVPs) appendTo(ans []byte) []byte {
	e.mu.Lock()
	avps := e.avps
	if !e.until.IsZero() && time.Now().After(e.until) {
		avps = nil
	}
	e.mu.Unlock()
	if len(avps) == 0 {
		return ans
	}
	out := append(ans, avps...)
	n := len(out)
	out[1], out[2], out[3] = byte(n>>16), byte(n>>8), byte(n)
	return out
}
