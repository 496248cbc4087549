package quota

import (
	"time"
)

// clockSample is one measure of the store's clock: offset to add to the
// local clock, round trip it was measured over.
type clockSample struct{ offset, rtt time.Duration }

// clockSamples is how many recent measures the offset is chosen from (the
// one of least round trip: a slow answer, e.g. a stalled store, measures
// the offset worst).
const clockSamples = 8

// clockSlack is the disagreement, beyond both measures' round trips,
// taken as a step of a clock (NTP stepping the host, a VM resumed): the
// older measures are dropped.
const clockSlack = 2 * time.Millisecond

// clockSample takes the store's clock st, read by a command sent at local
// time sent and answered at recv (under syncMu).
func (q *Quota) clockSample(sent, recv, st time.Time, err error) {
	if err != nil || st.IsZero() {
		return
	}
	rtt := max(recv.Sub(sent), 0)
	s := clockSample{offset: st.Sub(sent.Add(rtt / 2)), rtt: rtt}
	if len(q.samples) > 0 {
		cur := q.bestSample()
		if d := s.offset - cur.offset; d > (s.rtt+cur.rtt)/2+clockSlack || -d > (s.rtt+cur.rtt)/2+clockSlack {
			q.samples = q.samples[:0]
		}
	}
	if len(q.samples) == clockSamples {
		q.samples = q.samples[1:]
	}
	q.samples = append(q.samples, s)
	best := q.bestSample()
	q.offset.Store(int64(best.offset))
	q.clockKnown.Store(true)
	q.stMu.Lock()
	q.st.ClockKnown, q.st.ClockOffset, q.st.ClockRTT = true, -best.offset, best.rtt
	q.stMu.Unlock()
}

func (q *Quota) bestSample() clockSample {
	best := q.samples[0]
	for _, s := range q.samples[1:] {
		if s.rtt <= best.rtt {
			best = s
		}
	}
	return best
}
