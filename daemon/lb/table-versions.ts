// Each VIP's Maglev table version in the cluster store (<prefix>lb:{<vip>}:table, a hash): the target set
// (row) every LB node of the VIP forwards new clients by, and a change waiting to take effect. LB nodes
// switch together: a change is proposed by the first node whose configuration differs from the active
// row; each live member records its local flows the new row would move and acknowledges; once every live
// member has, the change is committed and each node activates it. Members are the nodes serving the VIP
// (a beat each second, gone after MEMBER_TTL_MS without one): a killed LB node holds a change back that long.
// Releases before table versions never read the key (they switch at once and record every pick).
import type Redis from 'ioredis';
import type { StoreConnection } from '../common/store-connection';
import { RUNS_WHEN_FULL } from '../common/store-full';

/** The hash's format (field "format"); a reader refuses another one rather than guess. */
export const TABLE_FORMAT = 1;

// KEYS: the VIP's table hash. ARGV: node, now ms, member ttl ms, the node's wanted row, the version it
// acknowledges ('' for none), key ttl ms, the row the node forwards by now (the active row when the hash has
// none: after a store restarted empty a change is still recorded before it takes effect). Fields: format; active and next as "<version>|<ms>|<row>";
// m:<node> member expiry ms; d:<node> the row the member wants; a:<node> the version it acknowledged.
// Returns {format, active, next or '', live members, those of them that have not acknowledged next}.
const STEP = `
local K = KEYS[1]
local node, now, ttl, want, ack = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local fmt = redis.call('HGET', K, 'format')
if fmt and fmt ~= '${TABLE_FORMAT}' then return {fmt, '', '', 0, {}} end
redis.call('HSET', K, 'format', '${TABLE_FORMAT}', 'm:' .. node, now + ttl, 'd:' .. node, want)
redis.call('PEXPIRE', K, ARGV[6])
local function parse(s)
  if not s then return nil end
  local v, at, row = string.match(s, '^(%d+)|(%d+)|(.*)$')
  return {tonumber(v), tonumber(at), row}
end
local active = parse(redis.call('HGET', K, 'active'))
if not active then
  active = {1, now, ARGV[7]}
  redis.call('HSET', K, 'active', '1|' .. now .. '|' .. ARGV[7])
end
local nxt = parse(redis.call('HGET', K, 'next'))
-- Live members and what they want; the lapsed ones go.
local all = redis.call('HGETALL', K)
local live, wants, acks = {}, {}, {}
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  local p, n = string.sub(f, 1, 2), string.sub(f, 3)
  if p == 'm:' then
    if tonumber(v) < now then
      redis.call('HDEL', K, f, 'd:' .. n, 'a:' .. n)
    else
      live[#live + 1] = n
    end
  elseif p == 'd:' then wants[n] = v
  elseif p == 'a:' then acks[n] = tonumber(v)
  end
end
if want ~= active[3] and (not nxt or nxt[3] ~= want) then
  -- A change (or a newer one than the change waiting): proposed; earlier acknowledgements do not count.
  local v = math.max(active[1], nxt and nxt[1] or 0) + 1
  nxt = {v, now, want}
  redis.call('HSET', K, 'next', v .. '|' .. now .. '|' .. want)
end
if nxt and ack ~= '' and tonumber(ack) == nxt[1] and want == nxt[3] then
  redis.call('HSET', K, 'a:' .. node, ack)
  acks[node] = nxt[1]
end
local waiting = {}
if nxt then
  local back = true
  for _, n in ipairs(live) do
    if acks[n] ~= nxt[1] then waiting[#waiting + 1] = n end
    if wants[n] ~= active[3] and n ~= node then back = false end
  end
  if want ~= active[3] then back = false end
  if back then
    -- Every live member wants the active row again (the change was undone before it took effect).
    redis.call('HDEL', K, 'next')
    nxt = nil
    waiting = {}
  elseif #waiting == 0 then
    active = {nxt[1], now, nxt[3]}
    redis.call('HSET', K, 'active', nxt[1] .. '|' .. now .. '|' .. nxt[3])
    redis.call('HDEL', K, 'next')
    nxt = nil
  end
end
local function fmt3(t) return t[1] .. '|' .. t[2] .. '|' .. t[3] end
return {'${TABLE_FORMAT}', fmt3(active), nxt and fmt3(nxt) or '', #live, waiting}
`;

/** A table version: its number, when it was proposed (next) or activated (active), and its row. */
export interface TableVersion {
  version: number;
  atMs: number;
  /** The active targets, sorted and comma-joined ('' for none). */
  row: string;
}

export interface TableState {
  active: TableVersion;
  next?: TableVersion;
  /** Live members (the caller included). */
  members: number;
  /** Live members that have not acknowledged next yet. */
  waiting: string[];
}

/** The table hash holds another format than this release reads. */
export class TableFormatError extends Error {}

interface Scripted extends Redis {
  tetherLbTableStep(key: string, node: string, now: string, ttl: string, want: string, ack: string, keyTtl: string, have: string): Promise<[string, string, string, number, string[]]>;
}

function parseVersion(s: string): TableVersion {
  const m = /^(\d+)\|(\d+)\|(.*)$/.exec(s);
  if (!m) throw new TableFormatError(`table version "${s}" is not <version>|<ms>|<row>`);
  return { version: Number(m[1]), atMs: Number(m[2]), row: m[3] };
}

export class TableVersions {
  private readonly client: Scripted;
  private readonly prefix: string;

  constructor(conn: StoreConnection) {
    this.client = conn.client as Scripted;
    this.prefix = conn.prefix;
    // Beats and acknowledgements are small and fixed-size: they run on a full store too (a change must not
    // wait for the store to empty; the moved flows' records are what a full store refuses).
    this.client.defineCommand('tetherLbTableStep', { numberOfKeys: 1, lua: RUNS_WHEN_FULL + STEP });
  }

  private key(vip: string): string {
    return `${this.prefix}lb:{${vip}}:table`;
  }

  /**
   * One step for node: beats its membership (memberTtlMs), says which row it wants, proposes it when it
   * differs from the active row and the change waiting, acknowledges `ack` (the version of the change
   * waiting, once node has recorded what it moves), commits when every live member has. The hash lapses
   * keyTtlMs after the last step of any member (no LB node serves the VIP any more); a new one starts from
   * `have`, the row the node forwards by (default: want).
   */
  async step(vip: string, node: string, want: string, opts: { ack?: number; memberTtlMs: number; keyTtlMs: number; nowMs?: number; have?: string }): Promise<TableState> {
    const now = opts.nowMs ?? Date.now();
    const [fmt, active, next, members, waiting] = await this.client.tetherLbTableStep(
      this.key(vip), node, String(now), String(opts.memberTtlMs), want, opts.ack !== undefined ? String(opts.ack) : '', String(opts.keyTtlMs), opts.have ?? want,
    );
    if (fmt !== String(TABLE_FORMAT)) throw new TableFormatError(`VIP ${vip}'s table is in format ${fmt}; this release reads format ${TABLE_FORMAT}`);
    return { active: parseVersion(active), ...(next ? { next: parseVersion(next) } : {}), members: Number(members), waiting: waiting ?? [] };
  }

  /** node no longer serves vip: a change does not wait for it. */
  async leave(vip: string, node: string): Promise<void> {
    await this.client.hdel(this.key(vip), `m:${node}`, `d:${node}`, `a:${node}`);
  }

  /** Removes the VIP's table (the Service is gone). */
  async drop(vip: string): Promise<void> {
    await this.client.del(this.key(vip));
  }
}
