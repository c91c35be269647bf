// The Lua scripts behind RedisStore. Each multi-step operation is one script, so Redis runs it atomically:
// no other client sees a half-done claim, and two racing claims are serialised by the server.
// Every key a script touches is passed in KEYS (never built in Lua), as Redis requires for scripts.

/**
 * KEYS[1] blocks hash (block → node); ARGV[1] block, ARGV[2] node.
 * Returns {state, holder}: state 'claimed' (new), 'owned' (the node already had it) or 'taken'.
 */
export const CLAIM_BLOCK = `
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if not holder then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return {'claimed', ARGV[2]}
end
if holder == ARGV[2] then return {'owned', holder} end
return {'taken', holder}
`;

/** KEYS[1] blocks hash; ARGV[1] block, ARGV[2] node. Compare-and-delete: 1 when released, else 0. */
export const RELEASE_BLOCK = `
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
`;

// The owner's list keeps allocation order; the addrs hash is the authority on who holds an address,
// so list entries no longer mapped to the owner are ignored rather than trusted.
const HELD = `
local function held_by(owner)
  local held = {}
  for _, a in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
    if redis.call('HGET', KEYS[1], a) == owner then held[#held + 1] = a end
  end
  return held
end
`;

/**
 * KEYS[1] addrs hash (address → owner), KEYS[2] the owner's list; ARGV[1] owner, ARGV[2] 'count' or
 * 'explicit', ARGV[3] count, ARGV[4..] candidates or explicit addresses.
 * Returns {'ok', held, newly}, {'conflict', address, holder} or {'need', held}. Only 'ok' writes anything:
 * every check runs before the first write, so a refused call leaves no partial claim to roll back.
 */
export const ALLOCATE = `${HELD}
local owner, mode, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = held_by(owner)
local pick, seen = {}, {}
if mode == 'explicit' then
  for i = 4, #ARGV do
    local a = ARGV[i]
    if not seen[a] then
      seen[a] = true
      local holder = redis.call('HGET', KEYS[1], a)
      if not holder then
        pick[#pick + 1] = a
      elseif holder ~= owner then
        return {'conflict', a, holder}
      end
    end
  end
else
  if #held >= count then return {'ok', held, {}} end
  local want = count - #held
  for i = 4, #ARGV do
    if #pick == want then break end
    local a = ARGV[i]
    if not seen[a] then
      seen[a] = true
      if not redis.call('HGET', KEYS[1], a) then pick[#pick + 1] = a end
    end
  end
  if #pick < want then return {'need', held} end
end
for _, a in ipairs(pick) do
  redis.call('HSET', KEYS[1], a, owner)
  redis.call('RPUSH', KEYS[2], a)
  held[#held + 1] = a
end
return {'ok', held, pick}
`;

/** KEYS[1] addrs hash, KEYS[2] the owner's list; ARGV[1] owner. Returns the addresses freed. */
export const RELEASE_OWNER = `${HELD}
local freed = held_by(ARGV[1])
for _, a in ipairs(freed) do redis.call('HDEL', KEYS[1], a) end
redis.call('DEL', KEYS[2])
return freed
`;
