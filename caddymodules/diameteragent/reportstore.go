package diameteragent

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/olrshare"
)

// redisReports is olrshare.Store over go-redis: one hash per agent,
// "<key_prefix>:diameter_agent_doic:<agent name>", a field per report
// ("<type>:<name>", type 0 host, 1 realm, 2 peer) holding
// "<sequence> <reduction> <expiry in ms by Redis' clock>". The scripts
// make each check-then-write one atomic step and keep time by Redis' TIME,
// so the replicas' clocks do not matter.
type redisReports struct {
	c   redis.UniversalClient
	key string
}

// offerScript writes ARGV (field, sequence, reduction, validity left in
// ms) unless the field holds a report in force with an equal or higher
// sequence number (compared as decimal strings: Lua's numbers are
// doubles); a reduction of 0 ends the report in force and keeps the end
// until that report would have expired. The hash expires a day after its
// last write (a report is valid 24 h at most).
const offerScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local field, seq, red, ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local cseq, cexp
local cur = redis.call('HGET', KEYS[1], field)
if cur then
	local s, r, e = string.match(cur, '^(%d+) (%d+) (%d+)$')
	if s and tonumber(e) > now then cseq, cexp = s, e end
end
if cseq and (#seq < #cseq or (#seq == #cseq and seq <= cseq)) then return 0 end
if red == 0 then
	if not cseq then return 0 end
	redis.call('HSET', KEYS[1], field, seq .. ' 0 ' .. cexp)
else
	redis.call('HSET', KEYS[1], field, seq .. ' ' .. red .. ' ' .. string.format('%d', now + ms))
end
redis.call('PEXPIRE', KEYS[1], 90000000)
return 1`

// readScript returns Redis' time in ms and the fields in force, deleting
// the expired ones.
var readScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {string.format('%d', now)}
for i = 1, #all, 2 do
	local e = string.match(all[i + 1], ' (%d+)$')
	if e and tonumber(e) <= now then
		redis.call('HDEL', KEYS[1], all[i])
	else
		out[#out + 1] = all[i]
		out[#out + 1] = all[i + 1]
	end
end
return out`)

func (r redisReports) Offer(ctx context.Context, entries []olrshare.Entry) []error {
	cmds := make([]*redis.Cmd, len(entries))
	_, _ = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			cmds[i] = p.Eval(ctx, offerScript, []string{r.key}, fmt.Sprintf("%d:%s", e.Type, e.Name),
				strconv.FormatUint(e.Seq, 10), e.Reduction, e.Remaining.Milliseconds())
		}
		return nil
	})
	errs := make([]error, len(entries))
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			errs[i] = bindingStoreErr(err)
		}
	}
	return errs
}

func (r redisReports) Read(ctx context.Context) ([]olrshare.Entry, int, error) {
	vals, err := readScript.Run(ctx, r.c, []string{r.key}).StringSlice()
	if err != nil {
		return nil, 0, bindingStoreErr(err)
	}
	if len(vals) == 0 {
		return nil, 0, nil
	}
	now, err := strconv.ParseInt(vals[0], 10, 64)
	if err != nil {
		return nil, 0, bindingStoreErr(err)
	}
	var out []olrshare.Entry
	bad := 0
	for i := 1; i+1 < len(vals); i += 2 {
		e, ok := parseReport(vals[i], vals[i+1], now)
		if !ok {
			bad++
			continue
		}
		out = append(out, e)
	}
	return out, bad, nil
}

// parseReport reads a field and its value as offerScript wrote them; the
// validity left is by Redis' clock (now, ms).
func parseReport(field, value string, now int64) (olrshare.Entry, bool) {
	typ, name, ok := strings.Cut(field, ":")
	t, err1 := strconv.ParseUint(typ, 10, 8)
	f := strings.Fields(value)
	if !ok || err1 != nil || len(f) != 3 {
		return olrshare.Entry{}, false
	}
	seq, err2 := strconv.ParseUint(f[0], 10, 64)
	red, err3 := strconv.ParseUint(f[1], 10, 32)
	exp, err4 := strconv.ParseInt(f[2], 10, 64)
	if err2 != nil || err3 != nil || err4 != nil || exp <= now {
		return olrshare.Entry{}, false
	}
	e := olrshare.Entry{Type: doic.ReportType(t), Name: name, Seq: seq, Reduction: uint32(red),
		Remaining: time.Duration(exp-now) * time.Millisecond}
	return e, olrshare.Valid(e) && t <= uint64(doic.PeerReport)
}

func (r redisReports) Ping(ctx context.Context) error { return bindingStoreErr(r.c.Ping(ctx).Err()) }

var _ olrshare.Store = redisReports{}

// reportStoreCollector reads each live agent's shared reports at scrape
// time.
type reportStoreCollector struct{}

var (
	descReportStoreUp = prometheus.NewDesc(metricsPrefix+"doic_store_up",
		"1 while the agent's DOIC report store is in use, 0 while it is marked down (each replica applies the reports it received).",
		[]string{"agent", "store"}, nil)
	descReportStoreEvents = prometheus.NewDesc(metricsPrefix+"doic_store_events_total",
		"The DOIC report store's counts by event: written, reconciled, read, merged, malformed, error, dropped (backlog full), expired (while queued), down.",
		[]string{"agent", "store", "event"}, nil)
)

func (reportStoreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReportStoreUp
	ch <- descReportStoreEvents
}

func (reportStoreCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range liveAgents() {
		d := e.agent.View().DOIC
		if d == nil || d.Store == nil {
			continue
		}
		v := d.Store
		up := 0.0
		if v.Healthy {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descReportStoreUp, prometheus.GaugeValue, up, e.name, v.Store)
		c := v.Counts
		for _, o := range []struct {
			event string
			n     int64
		}{{"written", c.Written}, {"reconciled", c.Reconciled}, {"read", c.Reads}, {"merged", c.Merged},
			{"malformed", c.Malformed}, {"error", c.Errors}, {"dropped", c.Dropped}, {"expired", c.Expired}, {"down", v.Downs}} {
			ch <- prometheus.MustNewConstMetric(descReportStoreEvents, prometheus.CounterValue, float64(o.n), e.name, v.Store, o.event)
		}
	}
}
