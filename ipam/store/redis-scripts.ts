// The Lua scripts behind RedisStore. Each multi-step operation is one script, so Redis runs it atomically:
// no other client sees a half-done claim, and two racing claims are serialised by the server.
// Every key a script touches is passed in KEYS (never built in Lua), as Redis requires for scripts, and
// every script's keys share one hash slot (one pool's keys carry the tag {<pool>}, the generation's keys
// the tag {generation}), so each runs whole on one node of a Redis Cluster.
//
// Compatibility with tetherds from before the tags (RedisStore's compat mode, only on a store that is not
// a Cluster and still has the untagged keys): CLAIM_BLOCK, RELEASE_BLOCK, ALLOCATE and RELEASE_OWNER then
// also get the untagged keys as extra KEYS, read them where the tagged ones say nothing, and write both,
// so tetherds of either version see each other's claims during a rolling upgrade. Those extra keys lie in
// other slots, which only a single server allows; on a Cluster they are never passed.

/**
 * KEYS[1] blocks hash (block → node), KEYS[2] (compat) the untagged blocks hash; ARGV[1] block, ARGV[2] node.
 * Returns {state, holder}: state 'claimed' (new), 'owned' (the node already had it) or 'taken'.
 * 'owned' writes the claim again: the caller's WAIT counts replicas up to its own connection's last write,
 * and a claim made before (on another connection, whose answer was lost) must be covered too.
 */
export const CLAIM_BLOCK = `
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if not holder and KEYS[2] then holder = redis.call('HGET', KEYS[2], ARGV[1]) end
if holder and holder ~= ARGV[2] then return {'taken', holder} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if KEYS[2] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
if holder then return {'owned', holder} end
return {'claimed', ARGV[2]}
`;

/**
 * KEYS[1] blocks hash, KEYS[2] (compat) the untagged one; ARGV[1] block, ARGV[2] node. Compare-and-delete:
 * 1 when released, else 0.
 */
export const RELEASE_BLOCK = `
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local old = false
if KEYS[2] then old = redis.call('HGET', KEYS[2], ARGV[1]) end
if cur == ARGV[2] or (not cur and old == ARGV[2]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  if old == ARGV[2] then redis.call('HDEL', KEYS[2], ARGV[1]) end
  return 1
end
return 0
`;

// The owner's list keeps allocation order; the addrs hash is the authority on who holds an address,
// so list entries no longer mapped to the owner are ignored rather than trusted. KEYS[1] and KEYS[2] are
// the addrs hash and the owner's list; OLD_ADDRS and OLD_LIST their untagged twins in compat mode (nil
// otherwise), consulted where the tagged hash has no holder and written alongside.
const HELD = (oldAddrs: string, oldList: string) => `
local OLD_ADDRS, OLD_LIST = ${oldAddrs}, ${oldList}
local function holder_of(a)
  local h = redis.call('HGET', KEYS[1], a)
  if not h and OLD_ADDRS then h = redis.call('HGET', OLD_ADDRS, a) end
  return h
end
local function held_by(owner)
  local held, seen = {}, {}
  local lists = {KEYS[2]}
  if OLD_LIST then lists[2] = OLD_LIST end
  for _, l in ipairs(lists) do
    for _, a in ipairs(redis.call('LRANGE', l, 0, -1)) do
      if not seen[a] and holder_of(a) == owner then
        seen[a] = true
        held[#held + 1] = a
      end
    end
  end
  return held
end
local function write(a, owner)
  redis.call('HSET', KEYS[1], a, owner)
  if OLD_ADDRS then redis.call('HSET', OLD_ADDRS, a, owner) end
end
-- An answer 'ok' writes what it returns (again, for what the owner held already), so the caller's WAIT
-- covers it even when the first write was made on another connection whose answer was lost.
local function rewrite(held, owner)
  for _, a in ipairs(held) do write(a, owner) end
end
`;

/**
 * KEYS[1] addrs hash (address → owner), KEYS[2] the owner's list, KEYS[3] the pool's generation mark (the
 * generation under which the pool's keys were last written by a guarded call), KEYS[4] and KEYS[5]
 * (compat) the untagged addrs hash and owner's list; ARGV[1] owner, ARGV[2]
 * 'count' or 'explicit', ARGV[3] count, ARGV[4] the generation the caller saw ('' = any), ARGV[5] '1'
 * while new addresses are held off, ARGV[6] the mark the generation's own step (MARK_POOL) allowed to be
 * replaced by ARGV[4] ('-' = none; '' = no mark), ARGV[7..] candidates or explicit addresses.
 * Returns {'ok', held, newly}, {'conflict', address, holder}, {'need', held}, {'holdoff', held} or
 * {'mark', mark}: the pool's mark is not the caller's generation (nor the one it may replace): ask
 * MARK_POOL on the generation's slot what that means. Only 'ok' writes addresses: every check runs before
 * the first one, so a refused call leaves no partial claim to roll back (a mark MARK_POOL allowed is set
 * whatever the outcome).
 */
export const ALLOCATE = `${HELD('KEYS[4]', 'KEYS[5]')}
if ARGV[4] ~= '' then
  local mark = redis.call('GET', KEYS[3]) or ''
  if mark ~= ARGV[4] then
    if mark ~= ARGV[6] then return {'mark', mark} end
    -- Set even when the call is refused below: MARK_POOL has recorded the pool as marked.
    redis.call('SET', KEYS[3], ARGV[4])
  end
end
local owner, mode, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = held_by(owner)
local pick, seen = {}, {}
if mode == 'explicit' then
  for i = 7, #ARGV do
    local a = ARGV[i]
    if not seen[a] then
      seen[a] = true
      local holder = holder_of(a)
      if not holder then
        pick[#pick + 1] = a
      elseif holder ~= owner then
        return {'conflict', a, holder}
      end
    end
  end
else
  if #held >= count then
    rewrite(held, owner)
    return {'ok', held, {}}
  end
  local want = count - #held
  for i = 7, #ARGV do
    if #pick == want then break end
    local a = ARGV[i]
    if not seen[a] then
      seen[a] = true
      if not holder_of(a) then pick[#pick + 1] = a end
    end
  end
  if #pick < want then return {'need', held} end
end
if #pick > 0 and ARGV[5] == '1' then return {'holdoff', held} end
rewrite(held, owner)
for _, a in ipairs(pick) do
  write(a, owner)
  redis.call('RPUSH', KEYS[2], a)
  if OLD_LIST then
    redis.call('LREM', OLD_LIST, 0, a)
    redis.call('RPUSH', OLD_LIST, a)
  end
  held[#held + 1] = a
end
return {'ok', held, pick}
`;

/**
 * KEYS[1] addrs hash, KEYS[2] the owner's list, KEYS[3] and KEYS[4] (compat) their untagged twins; ARGV[1]
 * owner. Returns the addresses freed.
 */
export const RELEASE_OWNER = `${HELD('KEYS[3]', 'KEYS[4]')}
local freed = held_by(ARGV[1])
for _, a in ipairs(freed) do
  if redis.call('HGET', KEYS[1], a) == ARGV[1] then redis.call('HDEL', KEYS[1], a) end
  if OLD_ADDRS and redis.call('HGET', OLD_ADDRS, a) == ARGV[1] then redis.call('HDEL', OLD_ADDRS, a) end
end
redis.call('DEL', KEYS[2])
if OLD_LIST then redis.call('DEL', OLD_LIST) end
return freed
`;

/**
 * KEYS[1] the generation token, KEYS[2] when it was created (ms, the store's clock), KEYS[3] the token a
 * node marked as a restart, KEYS[4] the set of pools marked in this generation (see MARK_POOL); ARGV[1] a
 * fresh token, ARGV[2] a token to mark as a restart ('' = none: only the current token can be marked, by a
 * node that saw an older one). Creates the generation when there is none. Returns {token, ageMs, how,
 * restarted}: how 'new' (created now), 'kept', or 'upgraded' (a token an older tetherd created without its
 * birth time, or a birth time that is not a number: the birth is recorded as now, the safe side: holders
 * get a full hold-off to re-assert); restarted 1 when the current token is marked as a restart (the store
 * lost data nodes held), else 0 (a new store, as far as any node has said). TIME makes the script
 * non-deterministic: effects replication (the default since Redis 5) copes with that.
 */
export const GENERATION = `
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = redis.call('GET', KEYS[1])
if not token then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], now)
  redis.call('DEL', KEYS[4])
  return {ARGV[1], 0, 'new', 0}
end
if ARGV[2] ~= '' and ARGV[2] == token then redis.call('SET', KEYS[3], token) end
local restarted = 0
if redis.call('GET', KEYS[3]) == token then restarted = 1 end
local born = redis.call('GET', KEYS[2])
if not born or not string.match(born, '^%d+$') then
  redis.call('SET', KEYS[2], now)
  return {token, 0, 'upgraded', restarted}
end
return {token, math.max(0, now - tonumber(born)), 'kept', restarted}
`;

/**
 * The generation's side of a guarded allocation whose pool mark (see ALLOCATE) is not the caller's
 * generation. KEYS[1] the generation token, KEYS[2] when it was created, KEYS[3] the restart mark, KEYS[4]
 * the set of pools marked in this generation; ARGV[1] the caller's generation, ARGV[2] the pool, ARGV[3]
 * the mark the pool has ('' = none), ARGV[4] a fresh token. Returns:
 * - 'stale': the caller's generation is not the current one (the store lost its data, or it was replaced
 *   since the caller looked): nothing is allocated; the caller looks again.
 * - 'new': the pool has no mark and was never marked in this generation: its keys hold nothing but what
 *   holders re-asserted (or nothing at all); ALLOCATE may mark it, and CONFIRM_POOL then records it.
 * - 'adopt': the pool's mark is an older generation's: the pool's keys outlived a generation change (only
 *   the generation's slot lost its data; a holder-side hold-off already ran for the current one), so what
 *   they hold is still true; ALLOCATE may replace the mark.
 * - 'recheck': the pool is recorded as marked but the caller's read of its mark came before this check
 *   (ARGV[5] not '1'): read the mark again, then ask again with ARGV[5] '1'.
 * - 'lost': the pool was marked in this generation and its mark is gone: the pool's slot lost its data
 *   (a Redis Cluster node restarted empty) while the generation's slot kept it. The generation is replaced
 *   here, as a restart, so every holder re-asserts and new addresses wait for the hold-off.
 */
export const MARK_POOL = `
if redis.replicate_commands then redis.replicate_commands() end
local token = redis.call('GET', KEYS[1])
if token ~= ARGV[1] then return 'stale' end
local member = redis.call('SISMEMBER', KEYS[4], ARGV[2]) == 1
if ARGV[3] == '' and member then
  -- The caller read the pool's mark before this membership: a racing first writer may have set the mark
  -- and recorded the pool since. Only a mark read after membership was seen (ARGV[5] '1') proves a loss.
  if ARGV[5] ~= '1' then return 'recheck' end
  local t = redis.call('TIME')
  redis.call('SET', KEYS[1], ARGV[4])
  redis.call('SET', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('SET', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[4])
  return 'lost'
end
if ARGV[3] == '' then return 'new' end
redis.call('SADD', KEYS[4], ARGV[2])
return 'adopt'
`;

/**
 * After an ALLOCATE that set a pool's first mark of this generation (MARK_POOL said 'new'): records the
 * pool as marked. Only then can a missing mark mean lost data: recorded before the mark is written (in
 * MARK_POOL), another node's first allocation racing between the two steps found "recorded, no mark" and
 * took a fresh store for one that lost data (seen: every new store held new addresses off for 12 s).
 * KEYS[1] the generation token, KEYS[2] the set of pools marked in this generation; ARGV[1] the caller's
 * generation, ARGV[2] the pool. Returns 1 when recorded, 0 when the generation changed meanwhile.
 */
export const CONFIRM_POOL = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SADD', KEYS[2], ARGV[2])
return 1
`;
