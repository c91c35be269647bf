// A membership set in the cluster store whose cost per member does not grow with its size: a hash of
// member → value, a sorted set of expiry times (the store's clock), a version and a short log of changes.
// A member heartbeats with one script call that writes its value only when it changed; whoever's call sees
// an expired member first removes it; a reader keeps a copy and is sent only the changes since the version
// it holds (the whole hash only when the log no longer covers that version, e.g. after a store wipe).
// All keys of one set share a hash tag, so the script touches one slot (Redis Cluster).
import type Redis from 'ioredis';
import { RUNS_WHEN_FULL } from './store-full';

/** The set's keys: `base` must carry the hash tag, e.g. "{tether:nodes}". */
export function memberKeys(base: string): [string, string, string, string] {
  return [base, `${base}:expiry`, `${base}:version`, `${base}:log`];
}

/** Expired members removed per call (more are removed by the next calls: bounded work per call). */
const PRUNE_MAX = 16;
/** Changes kept for readers behind; one further behind reads the whole set once. */
const LOG_MAX = 256;

// KEYS: hash, expiry, version, log.
// ARGV: member ('' none), value ('' removes the member), ttlMs, since (-1: send no changes), pruneMax, logMax,
// check ('1': compare the stored value with ours and write it if it differs; '0': only when the member was
// not in the set, i.e. new, expired and pruned, or the store lost its data; the caller sends '1' whenever
// its value changed since its last call that went through).
// Returns {version, mode, data}: mode 0 nothing changed since `since` (or none asked), 1 the log entries
// newer than `since` (newest first, each JSON [version, member, value|false]), 2 the whole hash.
// Versions start at the store's clock in ms (13 digits: exact in Lua's doubles and its %.14g), so a set
// that was wiped and written again does not reuse versions a reader holds.
const SCRIPT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ver = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
local changed = false
local function change(m, v)
  if ver == 0 then ver = now else ver = ver + 1 end
  redis.call('LPUSH', KEYS[4], cjson.encode({string.format('%d', ver), m, v}))
  changed = true
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
for _, m in ipairs(dead) do
  if m ~= ARGV[1] or ARGV[2] == '' then
    redis.call('ZREM', KEYS[2], m)
    if redis.call('HDEL', KEYS[1], m) == 1 then change(m, false) end
  end
end
if ARGV[1] ~= '' then
  if ARGV[2] == '' then
    redis.call('ZREM', KEYS[2], ARGV[1])
    if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then change(ARGV[1], false) end
  else
    local added = redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
    if (added == 1 or ARGV[7] == '1') and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
      redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
      change(ARGV[1], ARGV[2])
    end
  end
end
if changed then
  redis.call('SET', KEYS[3], string.format('%d', ver))
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[6]) - 1)
end
local v = string.format('%d', ver)
local since = tonumber(ARGV[4])
if since < 0 or since == ver then return {v, 0} end
local n = ver - since
if since > 0 and since < ver and n <= redis.call('LLEN', KEYS[4]) then
  local entries = redis.call('LRANGE', KEYS[4], 0, n - 1)
  if tonumber(cjson.decode(entries[#entries])[1]) == since + 1 then return {v, 1, entries} end
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if redis.call('ZSCORE', KEYS[2], all[i]) then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return {v, 2, out}
`;

type Reply = [string, number, string[]?];

interface Scripted extends Redis {
  tetherMembers(hash: string, expiry: string, version: string, log: string, member: string, value: string, ttlMs: number, since: number, pruneMax: number, logMax: number, check: string): Promise<Reply>;
}

function scripted(client: Redis): Scripted {
  const c = client as Scripted;
  if (typeof c.tetherMembers !== 'function') client.defineCommand('tetherMembers', { numberOfKeys: 4, lua: RUNS_WHEN_FULL + SCRIPT });
  return c;
}

/** One call: heartbeat `member` (value undefined: remove it; member '': nobody), prune, changes since `since`. */
export async function memberCall(client: Redis, base: string, member: string, value: string | undefined, ttlMs: number, since: number, check = true): Promise<Reply> {
  return scripted(client).tetherMembers(...memberKeys(base), member, value ?? '', ttlMs, since, PRUNE_MAX, LOG_MAX, check ? '1' : '0');
}

/**
 * A registration is refreshed at most this often (a fraction of its TTL) while its value stays the same:
 * with the callers' 1 s passes and 15 s TTL, every other pass (1.5 s: a change reaches every copy within
 * that), leaving 13.5 s of slack for a node that stalls.
 */
export const REFRESH_FRACTION = 0.1;
/** An unchanged registration's stored value is compared with it at least this often. */
const CHECK_EVERY_MS = 30_000;

/**
 * A copy of one set, kept current by the changes each call brings. `parse` validates a value (undefined
 * leaves the member out: its own code logs why); parsed values are kept, so a read costs nothing.
 */
export class MemberView<T> {
  private readonly raw = new Map<string, string>();
  private readonly parsed = new Map<string, T>();
  /** The version this copy is at (0: nothing read yet). */
  version = 0;

  constructor(
    private readonly client: Redis,
    readonly base: string,
    private readonly parse: (member: string, raw: string) => T | undefined,
  ) {}

  /** Members and their values as of the last call. */
  entries(): Map<string, T> {
    return this.parsed;
  }

  private checkedAt = 0;

  /** The last beat that went through: what it wrote, and when. */
  private last?: { member: string; value: string | undefined; at: number };

  /**
   * Heartbeats `member` with `value` (undefined: removes it) and brings this copy up to date. Returns
   * whether it changed. An unchanged registration is refreshed only once REFRESH_FRACTION of its TTL has
   * passed since the last beat that went through (until then nothing is sent and the copy stays as it
   * is); a changed one is sent at once, and only then is the stored value compared and written.
   */
  async beat(member: string, value: string | undefined, ttlMs: number): Promise<boolean> {
    const now = Date.now();
    const same = this.last !== undefined && this.last.member === member && this.last.value === value;
    if (same && value !== undefined && now - this.last!.at < ttlMs * REFRESH_FRACTION) return false;
    // The stored value is compared when ours changed, and now and then anyway (a hand edit or garbage in
    // our own entry is repaired within CHECK_EVERY_MS).
    const check = !same || now - this.checkedAt >= CHECK_EVERY_MS;
    const changed = this.apply(await memberCall(this.client, this.base, member, value, ttlMs, this.version, check));
    this.last = { member, value, at: now };
    if (check) this.checkedAt = now;
    return changed;
  }

  /** Brings this copy up to date (and prunes expired members, as every call does). Returns whether it changed. */
  async poll(): Promise<boolean> {
    return this.apply(await memberCall(this.client, this.base, '', undefined, 0, this.version));
  }

  private apply([v, mode, data]: Reply): boolean {
    const version = Number(v);
    if (mode === 0) {
      this.version = version;
      return false;
    }
    if (mode === 2) {
      this.raw.clear();
      this.parsed.clear();
      for (let i = 0; i + 1 < (data ?? []).length; i += 2) this.set(data![i], data![i + 1]);
    } else {
      for (const e of [...(data ?? [])].reverse()) {
        const [, member, value] = JSON.parse(e) as [string, string, string | false];
        if (value === false) {
          this.raw.delete(member);
          this.parsed.delete(member);
        } else this.set(member, value);
      }
    }
    this.version = version;
    return true;
  }

  private set(member: string, raw: string): void {
    if (this.raw.get(member) === raw) return;
    this.raw.set(member, raw);
    const v = this.parse(member, raw);
    if (v === undefined) this.parsed.delete(member);
    else this.parsed.set(member, v);
  }
}
