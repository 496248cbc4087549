package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
)

// Delay adds a fixed one-way delay to every packet host sends to each
// destination (an address or CIDR prefix → its delay): real packet delay
// on the wire, seen by every protocol and every round trip (a TCP
// handshake, a TLS exchange, an HTTP request), not a server that answers
// late. The kernels here have no netem, so each destination's packets go
// through an iptables NFQUEUE rule in host's namespace to this test
// process, which holds each one for its delay and then lets it go, in
// order. Rules are made with --queue-bypass and the queue fails open: if
// the test stops reading, packets pass undelayed rather than vanish. Call
// it once per host; it needs root and iptables-legacy (Debian iptables).
func (tp *Topology) Delay(t testing.TB, host string, delays map[string]time.Duration) {
	t.Helper()
	iptables, err := exec.LookPath("iptables-legacy")
	if err != nil {
		t.Fatal("iptables-legacy is needed (Debian package iptables; make test installs it)")
	}
	ns, err := os.Open("/var/run/netns/" + tp.NS(host))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	dsts := make([]string, 0, len(delays))
	for dst := range delays {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i, dst := range dsts {
		queue := uint16(i + 1) // queues are per namespace
		if err := holdQueue(ctx, int(ns.Fd()), queue, delays[dst]); err != nil {
			t.Fatalf("delay from %s to %s: %v", host, dst, err)
		}
		tp.Run(t, host, iptables, "-A", "OUTPUT", "-d", dst, "-j", "NFQUEUE", "--queue-num", fmt.Sprint(queue), "--queue-bypass")
	}
}

// heldPacket is one queued packet and when it may leave.
type heldPacket struct {
	id  uint32
	due time.Time
}

// holdQueue reads queue in the namespace netns (a file descriptor) and
// accepts each packet delay after it was queued. One goroutine releases
// them first in, first out, so a fixed delay never reorders a stream.
func holdQueue(ctx context.Context, netns int, queue uint16, delay time.Duration) error {
	nf, err := nfqueue.Open(&nfqueue.Config{
		NetNS:        netns,
		NfQueue:      queue,
		MaxPacketLen: 0,
		MaxQueueLen:  4096,
		Copymode:     nfqueue.NfQnlCopyMeta, // ids are enough: nothing is read or changed
		Flags:        nfqueue.NfQaCfgFlagFailOpen,
		WriteTimeout: time.Second,
	})
	if err != nil {
		return fmt.Errorf("opening nfqueue %d: %w", queue, err)
	}
	if err := nf.SetOption(netlink.NoENOBUFS, true); err != nil {
		nf.Close()
		return err
	}
	held := make(chan heldPacket, 8192)
	err = nf.RegisterWithErrorFunc(ctx, func(a nfqueue.Attribute) int {
		if a.PacketID != nil {
			held <- heldPacket{*a.PacketID, time.Now().Add(delay)}
		}
		return 0
	}, func(err error) int {
		if ctx.Err() != nil || strings.Contains(err.Error(), "closed") {
			return 1 // stop reading
		}
		return 0 // a timeout or a dropped message: read on
	})
	if err != nil {
		nf.Close()
		return err
	}
	go func() {
		defer nf.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-held:
				time.Sleep(time.Until(p.due))
				nf.SetVerdict(p.id, nfqueue.NfAccept)
			}
		}
	}()
	return nil
}
