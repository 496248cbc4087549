package ogs

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// The client reports in Redis (ogs.ReportStore), under NS = key_prefix +
// ":ogs:" + the store name, every key in one Redis Cluster slot (the tag
// {H}, H a hash of NS), so one script may bound them together:
//
//	NS:reports{H}:idx        sorted set: location → time of its last change (Redis' clock, ms)
//	NS:reports{H}:v:LOCATION hash: "REPORTER GATEWAY" → "RTT_MS UNIX_MS" (RTT "-": failed)
//	NS:reports{H}:r:LOCATION sorted set: reporter → its newest measurement (Unix ms)
//
// A location's two keys live report_window after its latest write; the
// index drops locations unchanged that long, and beyond
// max_report_locations the least recently changed one with its keys.

func (r *redisStore) reportsNS() string {
	h := fnv.New32a()
	h.Write([]byte(r.ns))
	return fmt.Sprintf("%sreports{%08x}:", r.ns, h.Sum32())
}

// putVotes: KEYS votes, reporters, index; ARGV reporter, latest ms, ttl ms,
// max reporters, max locations, location, key base (NS:reports{H}:), max
// reporters per token, then (gateway, value, at ms) triples. Each vote is
// written unless the stored one of that reporter for that gateway is
// newer; the reporters beyond the bounds go with their votes by the rule
// of the local table (ogs.Reports: the token's own oldest beyond its
// bound, then the oldest of the token holding most), the locations beyond
// theirs with their keys. A token is the reporter up to its '|'.
var putVotes = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rep, ttl = ARGV[1], tonumber(ARGV[3])
for i = 9, #ARGV, 3 do
  local f = rep .. ' ' .. ARGV[i]
  local old = redis.call('HGET', KEYS[1], f)
  local oldAt = old and tonumber(string.match(old, ' (%d+)$'))
  if not oldAt or oldAt <= tonumber(ARGV[i + 2]) then redis.call('HSET', KEYS[1], f, ARGV[i + 1]) end
end
local cur = redis.call('ZSCORE', KEYS[2], rep)
if not cur or tonumber(cur) < tonumber(ARGV[2]) then redis.call('ZADD', KEYS[2], ARGV[2], rep) end
local function tok(r) return string.match(r, '^([^|]*)|') or r end
local all = redis.call('ZRANGE', KEYS[2], 0, -1)
local mine, n, count, gone, drop = tok(rep), #all, {}, {}, {}
for _, r in ipairs(all) do count[tok(r)] = (count[tok(r)] or 0) + 1 end
local function dropOldest(k)
  for _, r in ipairs(all) do
    if r ~= rep and not gone[r] and (k == nil or tok(r) == k) then
      gone[r], drop[#drop + 1], n = true, r, n - 1
      count[tok(r)] = count[tok(r)] - 1
      return
    end
  end
end
while count[mine] > tonumber(ARGV[8]) do dropOldest(mine) end
while n > tonumber(ARGV[4]) do
  local best, most = mine, count[mine]
  for k, c in pairs(count) do if c > most then best, most = k, c end end
  if most <= 1 then dropOldest(nil) else dropOldest(best) end
end
if #drop > 0 then
  redis.call('ZREM', KEYS[2], unpack(drop))
  local set = {}
  for _, r in ipairs(drop) do set[r .. ' '] = true end
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    local r = string.match(f, '^(.* )')
    if r and set[r] then redis.call('HDEL', KEYS[1], f) end
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[3], now, ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - ttl))
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[5])
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[3], over)
  for j = 1, #gone, 2 do redis.call('DEL', ARGV[7] .. 'v:' .. gone[j], ARGV[7] .. 'r:' .. gone[j]) end
end
redis.call('PEXPIRE', KEYS[3], ttl)
return now`)

func (r *redisStore) PutVotes(ctx context.Context, location, reporter string, votes []rttreports.StoredVote, latest time.Time, ttl time.Duration, b rttreports.Bounds) error {
	base := r.reportsNS()
	args := []any{reporter, latest.UnixMilli(), ttl.Milliseconds(), b.Reporters, b.Locations, location, base, b.PerToken}
	for _, v := range votes {
		args = append(args, v.Gateway, v.Value, v.At.UnixMilli())
	}
	err := putVotes.Run(ctx, r.client, []string{base + "v:" + location, base + "r:" + location, base + "idx"}, args...).Err()
	if err != nil {
		return r.trouble(ctx, "put_reports", err, location, gatewaysel.KeysReports)
	}
	return nil
}

func (r *redisStore) Changed(ctx context.Context, since int64, limit int) ([]rttreports.ChangedLocation, error) {
	zs, err := r.client.ZRangeByScoreWithScores(ctx, r.reportsNS()+"idx", &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf", Count: int64(limit)}).Result()
	if err != nil {
		return nil, r.trouble(ctx, "sync_reports", err, "", gatewaysel.KeysReports)
	}
	out := make([]rttreports.ChangedLocation, 0, len(zs))
	for _, z := range zs {
		if loc, ok := z.Member.(string); ok {
			out = append(out, rttreports.ChangedLocation{Location: loc, At: int64(z.Score)})
		}
	}
	return out, nil
}

func (r *redisStore) Votes(ctx context.Context, location string) (map[string]string, error) {
	m, err := r.client.HGetAll(ctx, r.reportsNS()+"v:"+location).Result()
	if err != nil {
		return nil, r.trouble(ctx, "sync_reports", err, location, gatewaysel.KeysReports)
	}
	return m, nil
}
