"""The Lua scripts behind the Redis lease, queue and kill: each operation is one atomic
round trip, so two processes never see half of another's step.

Keys, under a prefix `P` (default `turn:`), for a channel `C`:

- `P lease:C` — hash {worker, token, fence, author, message, stop, renewed_at}, expiring
  after the lease lifetime unless renewed; present = a turn runs in C somewhere.
- `P queue:C` — list of queued records (JSON: message_id, channel_id, author), FIFO.
- `P fence:C` — counter, incremented for every turn started in C (the fencing token).
- `P chain:C` — follow-up interrupts counted while C stays busy (S17 across processes).
- `P leases` — sorted set C -> lease expiry (ms, Redis clock), where takeover looks.
- `P seen:ID` — a delivered message or interaction id, for deduplication.
- `P refused:C:U` — user U was told C's queue is full (one polite refusal per window).
- channel `P worker:W` — pub/sub of worker W: {"op": "kill"|"follow_up", "channel": C,
  "fence": F, ...}, F the fence of the turn the signal is meant for.

Times come from the Redis server's clock (`TIME`), so workers' clocks never disagree about
a lease. Keys are built inside the scripts from the prefix: one Redis, not Redis Cluster.
"""

from __future__ import annotations

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_START_TURN = """
local function start_turn(p, ch, worker, token, ttl, now, record)
  local fence = redis.call('INCR', p .. 'fence:' .. ch)
  -- A malformed record starts a turn too (the worker skips it): read it defensively.
  local ok, decoded = pcall(cjson.decode, record)
  if not ok or type(decoded) ~= 'table' then decoded = {} end
  local author, message = decoded['author'], decoded['message_id']
  if type(author) ~= 'string' and type(author) ~= 'number' then author = '' end
  if type(message) ~= 'string' and type(message) ~= 'number' then message = '' end
  redis.call('HSET', p .. 'lease:' .. ch, 'worker', worker, 'token', token, 'fence', fence,
             'author', author, 'message', message, 'stop', '0', 'renewed_at', now)
  redis.call('PEXPIRE', p .. 'lease:' .. ch, ttl)
  redis.call('ZADD', p .. 'leases', now + ttl, ch)
  return fence
end
"""

SUBMIT = (
    _NOW
    + _START_TURN
    + """
-- ARGV: prefix, channel, record, dedup id, worker, token, ttl_ms, max_queued, author, dedup_s,
-- refusal window (s). A full queue answers {'full', waiting, 1 for the sender's first refusal
-- in the window, else 0}.
local p, ch, record = ARGV[1], ARGV[2], ARGV[3]
local ttl, max_queued = tonumber(ARGV[7]), tonumber(ARGV[8])
if not redis.call('SET', p .. 'seen:' .. ARGV[4], '1', 'NX', 'EX', ARGV[10]) then
  return {'duplicate'}
end
local lease = p .. 'lease:' .. ch
local queue = p .. 'queue:' .. ch
if redis.call('EXISTS', lease) == 1 then
  local held = redis.call('HMGET', lease, 'stop', 'worker', 'author', 'fence')
  if held[1] == '1' then return {'stopping'} end
  local waiting = redis.call('LLEN', queue)
  if waiting >= max_queued then
    local first = redis.call('SET', p .. 'refused:' .. ch .. ':' .. ARGV[9], '1', 'NX', 'EX',
                             ARGV[11])
    return {'full', waiting, first and 1 or 0}
  end
  redis.call('RPUSH', queue, record)
  if held[3] == ARGV[9] then
    redis.call('PUBLISH', p .. 'worker:' .. held[2], cjson.encode(
      {op = 'follow_up', channel = ch, author = ARGV[9], fence = tonumber(held[4])}))
  end
  return {'queued', waiting + 1}
end
-- No lease: this worker takes the channel. A queue left by a crashed owner runs first.
redis.call('RPUSH', queue, record)
local head = redis.call('LPOP', queue)
local fence = start_turn(p, ch, ARGV[5], ARGV[6], ttl, now, head)
local chain = redis.call('GET', p .. 'chain:' .. ch) or '0'
return {'started', redis.call('LLEN', queue), fence, head, chain}
"""
)

RENEW = (
    _NOW
    + """
-- ARGV: prefix, ttl_ms, then (channel, token) pairs. Returns now, the earliest lease expiry
-- of any worker (-1 if none), then one status per pair: 0 lost, 1 held, 2 held but stopped.
local p, ttl = ARGV[1], tonumber(ARGV[2])
local out = {now, -1}
for i = 3, #ARGV, 2 do
  local ch, token = ARGV[i], ARGV[i + 1]
  local lease = p .. 'lease:' .. ch
  local held = redis.call('HMGET', lease, 'token', 'stop')
  if held[1] == token then
    redis.call('PEXPIRE', lease, ttl)
    redis.call('HSET', lease, 'renewed_at', now)
    redis.call('ZADD', p .. 'leases', now + ttl, ch)
    table.insert(out, held[2] == '1' and 2 or 1)
  else
    table.insert(out, 0)
  end
end
local first = redis.call('ZRANGE', p .. 'leases', 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out
"""
)

POP_NEXT = (
    _NOW
    + _START_TURN
    + """
-- ARGV: prefix, channel, token, ttl_ms, follow-up interrupts of the turn that ended
local p, ch, token, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local lease = p .. 'lease:' .. ch
local held = redis.call('HMGET', lease, 'token', 'worker')
if held[1] ~= token then return {'lost'} end
local head = redis.call('LPOP', p .. 'queue:' .. ch)
if not head then
  redis.call('DEL', lease, p .. 'chain:' .. ch)
  redis.call('ZREM', p .. 'leases', ch)
  return {'released'}
end
redis.call('SET', p .. 'chain:' .. ch, ARGV[5])
local fence = start_turn(p, ch, held[2], token, ttl, now, head)
return {'next', fence, head, ARGV[5]}
"""
)

HAND_OVER = (
    _NOW
    + """
-- ARGV: prefix, channel, token. A worker shutting down gives up its lease; a queue left
-- behind is due for takeover at once.
local p, ch, token = ARGV[1], ARGV[2], ARGV[3]
local lease = p .. 'lease:' .. ch
if redis.call('HGET', lease, 'token') ~= token then return 0 end
redis.call('DEL', lease)
if redis.call('LLEN', p .. 'queue:' .. ch) > 0 then
  redis.call('ZADD', p .. 'leases', now, ch)
else
  redis.call('ZREM', p .. 'leases', ch)
  redis.call('DEL', p .. 'chain:' .. ch)
end
return 1
"""
)

KILL = """
-- ARGV: prefix, channel, interaction id, dedup_s, user id, privileged (1: may stop anyone's
-- reply and drop the whole queue; 0: only the reply to the user's own message, and only the
-- user's own queued records, A7). Returns {'duplicate'}, {'not_allowed'} or
-- {'done', running (0/1), dropped, someone else's reply runs on (0/1)}.
local p, ch = ARGV[1], ARGV[2]
local lease = p .. 'lease:' .. ch
local queue = p .. 'queue:' .. ch
local held = redis.call('HMGET', lease, 'worker', 'author', 'fence')
local privileged = ARGV[6] == '1'
local mine = {}
if not privileged then
  for _, raw in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    local ok, record = pcall(cjson.decode, raw)
    if ok and type(record) == 'table' and tostring(record['author']) == ARGV[5] then
      table.insert(mine, raw)
    end
  end
  if held[2] ~= ARGV[5] and #mine == 0 then return {'not_allowed'} end
end
if not redis.call('SET', p .. 'seen:' .. ARGV[3], '1', 'NX', 'EX', ARGV[4]) then
  return {'duplicate'}
end
local dropped = #mine
if privileged then
  dropped = redis.call('LLEN', queue)
  redis.call('DEL', queue, p .. 'chain:' .. ch)
else
  for _, raw in ipairs(mine) do redis.call('LREM', queue, 1, raw) end
  if held[2] ~= ARGV[5] then return {'done', 0, dropped, held[1] and 1 or 0} end
  if redis.call('LLEN', queue) == 0 then redis.call('DEL', p .. 'chain:' .. ch) end
end
if not held[1] then return {'done', 0, dropped} end
redis.call('HSET', lease, 'stop', '1')
redis.call('PUBLISH', p .. 'worker:' .. held[1],
           cjson.encode({op = 'kill', channel = ch, fence = tonumber(held[3])}))
return {'done', 1, dropped}
"""

TAKEOVER = (
    _NOW
    + _START_TURN
    + """
-- ARGV: prefix, worker, token prefix, ttl_ms, limit. Takes the channels whose lease expired
-- with messages still queued; returns {channel, token, fence, record, chain} for each.
local p, worker, ttl = ARGV[1], ARGV[2], tonumber(ARGV[4])
local taken = {}
for _, ch in ipairs(redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', now, 'LIMIT', 0,
                               tonumber(ARGV[5]))) do
  if redis.call('EXISTS', p .. 'lease:' .. ch) == 0 then
    local head = redis.call('LPOP', p .. 'queue:' .. ch)
    if not head then
      redis.call('ZREM', p .. 'leases', ch)
      redis.call('DEL', p .. 'chain:' .. ch)
    else
      local token = ARGV[3] .. ':' .. ch
      local fence = start_turn(p, ch, worker, token, ttl, now, head)
      local chain = redis.call('GET', p .. 'chain:' .. ch) or '0'
      table.insert(taken, {ch, token, fence, head, chain})
    end
  end
end
return taken
"""
)
