// Every format two releases share (daemon/formats.ts), held to golden samples: each registry entry's
// canonical sample is written by the real encoder or writer and must equal test/fixtures/formats/<name>/
// v<version>.* byte for byte (store formats: every key, its type and value, key names with their hash tags),
// so a format that changes without a new version fails here; and every golden of a version the registry
// says this release reads is read back by the real reader. A new version gets its golden with
// TETHER_WRITE_GOLDENS=1, which only ever adds missing goldens, never rewrites one.
// Last: a module that defines a shared format (a store key, a state file, a datagram, a pinned map, a CRD)
// but is not named by the registry fails the test.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as net from 'node:net';
import Redis from 'ioredis';
import { FORMATS, formatNamed } from '../../daemon/formats';
import { makeLogger, setLogger } from '../../lib/log';
import { VERSION as RELEASE } from '../../lib/version';
import { callWith } from '../../lib/api/call-core';
import { nodeConnector } from '../../lib/api/client';
import { ApiServer } from '../../daemon/server';
import { parseQueuedDelete, queueDelete, type QueuedDelete } from '../../lib/api/delete-queue';
import { PodStore, type PodRecord } from '../../daemon/state/pod-store';
import { VIP_RECORD_FILE, VipRecord } from '../../daemon/lb/vip-record';
import { journalHostSysctl, readSysctlJournal, useSysctlJournal } from '../../daemon/sys/sysctl-journal';
import { AllocationStore, type AllocationRecord } from '../../ipam/allocation-store';
import { NodeRegistry, nodesKey } from '../../daemon/common/node-registry';
import { OwnershipStore, readNotice, type GatewayInfo } from '../../daemon/egress/ownership-store';
import { RedisStore } from '../../ipam/store/redis-store';
import type { StoredMapping } from '../../daemon/lb/mapping-fields';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { HealthReports } from '../../daemon/health/health-reports';
import { decodeNotices, encodeNotices, noticeKey } from '../../daemon/egress/ownership-notice';
import { BfdDiag, BfdState, decodeControl, encodeControl, type BfdControl } from '../../daemon/bfd/packet';
import { BfdAuthType, resolveAuth, signPacket, verifyDigest } from '../../daemon/bfd/auth';
import { FrameType, FrameWriter, openFrame } from '../../daemon/conntrack-sync/frame';
import { readEvent, readList, writeEvent, writeList, MAX_EVENT_BYTES } from '../../daemon/conntrack-sync/entry-codec';
import { readHello, writeHello } from '../../daemon/conntrack-sync/handshake';
import { IPS, type ConntrackEvent } from '../../daemon/conntrack/types';
import { FOU_LAYOUTS, FOU_MAP_LAYOUTS } from '../../daemon/bpf/fou-structs';
import { EGRESS_LAYOUTS, EGRESS_MAP_LAYOUTS } from '../../daemon/bpf/egress-structs';
import { LB_LAYOUTS, LB_MAP_LAYOUTS } from '../../daemon/bpf/lb-structs';
import { GUARD_MAP_LAYOUTS } from '../../daemon/bpf/egress-guard';
import { CRDS, crdManifest } from '../../daemon/objects/crds';
import { startRedis, type TestRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';

const ROOT = path.join(__dirname, '../..');
const FIXTURES = path.join(ROOT, 'test/fixtures/formats');
const WRITE = process.env.TETHER_WRITE_GOLDENS === '1';

test.before(() => setLogger(makeLogger({ level: process.env.TETHER_LOG_LEVEL ?? 'error' })));

// ---------------------------------------------------------------------------------------------------
// Goldens

type Files = Record<string, Buffer | string>;

function goldenPath(name: string, version: number, part: string): string {
  return path.join(FIXTURES, name, `v${version}.${part}`);
}

/** Compares each part with its golden; a missing golden is written only with TETHER_WRITE_GOLDENS=1. */
function checkGolden(name: string, version: number, files: Files): void {
  for (const [part, data] of Object.entries(files)) {
    const file = goldenPath(name, version, part);
    const bytes = Buffer.isBuffer(data) ? data : Buffer.from(data);
    if (!fs.existsSync(file)) {
      if (!WRITE) assert.unreachable(`${name}: no golden ${path.relative(ROOT, file)} for version ${version}: a changed format needs a new version in daemon/formats.ts, then TETHER_WRITE_GOLDENS=1 adds its golden`);
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, bytes);
      continue;
    }
    const want = fs.readFileSync(file);
    if (!want.equals(bytes)) {
      const msg = `${name} v${version}: ${part} differs from its golden ${path.relative(ROOT, file)}: the format changed without a new version (bump it in daemon/formats.ts and add the golden of the new version; keep reading the old one)`;
      if (/\.(json|txt)$/.test(part)) assert.fixture(bytes.toString(), want.toString(), msg);
      else assert.is(bytes.toString('hex'), want.toString('hex'), msg);
    }
  }
}

function goldenParts(name: string, version: number): Record<string, Buffer> {
  const dir = path.join(FIXTURES, name);
  const out: Record<string, Buffer> = {};
  for (const f of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
    const m = /^v(\d+)\.(.+)$/.exec(f);
    if (m && Number(m[1]) === version) out[m[2]] = fs.readFileSync(path.join(dir, f));
  }
  assert.ok(Object.keys(out).length, `${name}: no golden of version ${version} under ${path.relative(ROOT, dir)}, yet the registry says it is read`);
  return out;
}

const json = (v: unknown): string => JSON.stringify(v, null, 2) + '\n';
const tmp = (what: string): string => fs.mkdtempSync(path.join(os.tmpdir(), `tether-formats-${what}-`));

// ---------------------------------------------------------------------------------------------------
// The cluster store: a dump of every key under a prefix, with what varies between runs (times, store
// versions, random tokens) replaced by placeholders that restore() turns back into live values.

let redis: TestRedis;
let raw: Redis;
let seq = 0;
const freshPrefix = () => `fmt${++seq}:`;

test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
});

type Dumped = Record<string, { type: string; value: unknown }>;

/** Replaces run-dependent values inside a stored string: ISO times, ms times, this release's name. */
function normText(s: string): string {
  const o = tryJson(s);
  if (o === undefined || typeof o !== 'object' || o === null) return s;
  const walk = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') {
      const r: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v)) {
        if (k === 'at' && typeof x === 'string' && !Number.isNaN(Date.parse(x))) r[k] = '<iso>';
        else if (k === 'expiresAt' && typeof x === 'number') r[k] = '<ms>';
        else if (k === 'release' && x === RELEASE) r[k] = '<release>';
        else r[k] = walk(x);
      }
      return r;
    }
    return v;
  };
  return JSON.stringify(walk(o));
}

function tryJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
}

async function dump(prefix: string, tokens: Record<string, string> = {}): Promise<Dumped> {
  const keys = (await raw.keys(`${prefix}*`)).concat(await raw.keys(`{${prefix}*`)).sort();
  const out: Dumped = {};
  // Member-set versions start at the store's clock: log entries are written relative to the set's version.
  const isMemberSet = async (base: string) => (await raw.exists(`${base}:version`)) === 1;
  const sub = (s: string): string => {
    let r = s;
    for (const [t, name] of Object.entries(tokens)) r = r.split(t).join(name);
    return r;
  };
  for (const k of keys) {
    const name = sub(k.replace(prefix, '<prefix>'));
    const type = await raw.type(k);
    const base = k.endsWith(':log') && (await isMemberSet(k.slice(0, -':log'.length))) ? k.slice(0, -':log'.length) : undefined;
    let value: unknown;
    if (type === 'string') {
      const v = (await raw.get(k))!;
      value = k.endsWith(':version') && (await isMemberSet(k.slice(0, -':version'.length))) ? '<version>' : /generation\}?:born$/.test(k) ? '<ms>' : sub(normText(v));
    } else if (type === 'hash') {
      const h = await raw.hgetall(k);
      const isoField = (f: string) => f === 'at' && /^\d{4}-\d\d-\d\dT/.test(h[f]);
      value = Object.fromEntries(Object.keys(h).sort().map((f) => [sub(f), isoField(f) ? '<iso>' : sub(normText(h[f]))]));
    } else if (type === 'zset') {
      const z = await raw.zrange(k, 0, -1, 'WITHSCORES');
      const pairs: Array<[string, string]> = [];
      for (let i = 0; i < z.length; i += 2) pairs.push([sub(z[i]), k.endsWith(':expiry') ? '<expiry>' : z[i + 1]]);
      value = pairs.sort((a, b) => a[0].localeCompare(b[0]));
    } else if (type === 'list') {
      const l = await raw.lrange(k, 0, -1);
      const top = base !== undefined ? Number(await raw.get(`${base}:version`)) : 0;
      value = l.map((e) => {
        if (base === undefined) return sub(normText(e));
        // A member-set log entry [version, member, value]: its version relative to the set's current one.
        const [v, m, val] = JSON.parse(e) as [string, string, string | false];
        return JSON.stringify([`<version-${top - Number(v)}>`, m, val === false ? false : normText(val)]);
      });
    } else if (type === 'set') {
      value = (await raw.smembers(k)).map(sub).sort();
    } else assert.unreachable(`${k}: unexpected type ${type}`);
    out[name] = { type, value };
  }
  return out;
}

/** Writes a dump under `prefix` with live values for its placeholders (the inverse of dump()). */
async function restore(d: Dumped, prefix: string, tokens: Record<string, string> = {}): Promise<void> {
  const now = Date.now();
  const live = (s: string): string => {
    let r = s.replace(/"<ms>"/g, String(now + 60_000)).replace(/<ms>/g, String(now + 60_000));
    r = r.replace(/<iso>/g, new Date(now).toISOString()).replace(/<release>/g, RELEASE).replace(/<expiry>/g, String(now + 60_000));
    r = r.replace(/<version-(\d+)>/g, (_m, n) => String(now - Number(n))).replace(/<version>/g, String(now));
    for (const [t, name] of Object.entries(tokens)) r = r.split(name).join(t);
    return r;
  };
  for (const [name, { type, value }] of Object.entries(d)) {
    const k = live(name.replace('<prefix>', prefix));
    if (type === 'string') await raw.set(k, live(value as string));
    else if (type === 'hash') await raw.hset(k, Object.fromEntries(Object.entries(value as Record<string, string>).map(([f, v]) => [live(f), live(v)])));
    else if (type === 'zset') for (const [m, s] of value as Array<[string, string]>) await raw.zadd(k, live(s), live(m));
    else if (type === 'list') await raw.rpush(k, ...(value as string[]).map(live));
    else if (type === 'set') await raw.sadd(k, ...(value as string[]).map(live));
  }
}

/** The messages published on `channel` while `fn` runs. */
async function published(channel: string, fn: () => Promise<void>, want = 1): Promise<string[]> {
  const sub = new Redis({ path: redis.socketPath });
  const got: string[] = [];
  sub.on('message', (_c: string, m: string) => got.push(m));
  await sub.subscribe(channel);
  try {
    await fn();
    await waitFor(() => got.length >= want, `a message on ${channel}`, { timeoutMs: 3000 });
  } finally {
    sub.disconnect();
  }
  return got;
}

// ---------------------------------------------------------------------------------------------------
// Canonical samples (written by the real code) and readers (the real code reading a golden back)

interface Case {
  /** Writes the canonical sample of the current version with the real encoder. */
  write(): Promise<Files>;
  /** Older versions this release still writes (e.g. beside the current one in a compat mode), by version. */
  writeOld?: Record<number, () => Promise<Files>>;
  /** Reads a golden of `version` with this release's reader and checks what it says. */
  read(version: number, g: Record<string, Buffer>): Promise<void>;
}

const KEY32 = Buffer.alloc(32, 0x5a);

const QUEUED: Omit<QueuedDelete, 'format'> = {
  method: 'cni.del',
  queuedAt: '2026-01-02T03:04:05.000Z',
  reason: 'tetherd is not reachable at /run/tether/tetherd.sock: ENOENT',
  params: {
    command: 'DEL',
    containerId: 'c0ffee',
    netns: '/var/run/netns/cni-golden',
    ifName: 'eth0',
    args: { K8S_POD_NAMESPACE: 'default', K8S_POD_NAME: 'web-0' },
    config: { cniVersion: '1.0.0', name: 'k8s-pod-network', type: 'tether' },
  },
};

const POD: PodRecord = {
  network: 'k8s-pod-network',
  containerId: 'c0ffee',
  ifName: 'eth0',
  netns: '/var/run/netns/cni-golden',
  podNamespace: 'default',
  podName: 'web-0',
  ips: ['10.244.1.5'],
  hostIfName: 'vethgolden',
  labels: { app: 'web' },
  phase: 'attached',
  applied: { mtu: { before: 1500, after: 1450 } },
  config: { cniVersion: '1.0.0', name: 'k8s-pod-network', type: 'tether' },
  createdAt: '2026-01-02T03:04:05.000Z',
};

const ALLOC: AllocationRecord = {
  pool: 'pods-a',
  family: 4,
  address: '10.244.1.5',
  block: '10.244.1.0/26',
  owner: { containerId: 'c0ffee', ifName: 'eth0', network: 'k8s-pod-network', podNamespace: 'default', podName: 'web-0' },
  createdAt: '2026-01-02T03:04:05.000Z',
};

const GW: GatewayInfo = { pod: 'egress/gw-0', node: 'node-a', nodeAddress: '192.0.2.1', podIp: '10.244.1.9', zone: 'zone-a', maxAddresses: 2 };
const EGRESS = 'egress/out';

const BFD: BfdControl = {
  diag: BfdDiag.None,
  state: BfdState.Up,
  poll: false,
  final: true,
  cpi: false,
  demand: false,
  multipoint: false,
  detectMult: 3,
  myDiscr: 0x01020304,
  yourDiscr: 0x0a0b0c0d,
  desiredMinTxUs: 50_000,
  requiredMinRxUs: 50_000,
  requiredMinEchoRxUs: 0,
};
const BFD_AUTH = resolveAuth({ type: BfdAuthType.MeticulousKeyedSha1, keyId: 7, key: Buffer.alloc(20, 0x33) });

const SYNC_EVENTS: ConntrackEvent[] = [
  {
    type: 'new',
    entry: {
      orig: { family: 4, proto: 6, src: '10.244.1.5', dst: '198.51.100.7', sport: 40000, dport: 443 },
      reply: { family: 4, proto: 6, src: '198.51.100.7', dst: '203.0.113.10', sport: 443, dport: 40000 },
      status: IPS.CONFIRMED | IPS.SEEN_REPLY | IPS.ASSURED | IPS.SRC_NAT | IPS.SRC_NAT_DONE,
      timeout: 432000,
      mark: 0x100,
      zone: 0,
      tcp: { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 0x2323, flagsReply: 0x2323 },
      id: 1_000_001,
    },
  },
  {
    type: 'destroy',
    entry: {
      orig: { family: 6, proto: 17, src: 'fd00::5', dst: '2001:db8::53', sport: 5000, dport: 53 },
      reply: { family: 6, proto: 17, src: '2001:db8::53', dst: '2001:db8:ffff::10', sport: 53, dport: 5000 },
      status: IPS.CONFIRMED | IPS.SRC_NAT | IPS.SRC_NAT_DONE,
      timeout: 30,
    },
  },
];

const NONCE = Buffer.alloc(32, 0x11);

/** The layouts of one pinned map: its C declaration as the header says it, and the TypeScript mirror of its structs. */
function mapDeclarations(): Map<string, { header: string; decl: Record<string, string> }> {
  const out = new Map<string, { header: string; decl: Record<string, string> }>();
  for (const h of fs.readdirSync(path.join(ROOT, 'bpf')).filter((f) => /\.(h|c)$/.test(f))) {
    const text = fs.readFileSync(path.join(ROOT, 'bpf', h), 'utf8');
    for (const m of text.matchAll(/struct\s*\{([^}]*)\}\s*(\w+)\s+SEC\("\.maps"\)/g)) {
      const decl: Record<string, string> = {};
      for (const f of m[1].matchAll(/__(uint|type|array)\((\w+),\s*([^)]*)\)/g)) decl[f[2]] = f[3].trim().replace(/\s+/g, ' ');
      out.set(m[2], { header: `bpf/${h}`, decl });
    }
  }
  return out;
}

const STRUCTS = { ...FOU_LAYOUTS, ...EGRESS_LAYOUTS, ...LB_LAYOUTS };
const MAP_LAYOUTS = { ...FOU_MAP_LAYOUTS, ...EGRESS_MAP_LAYOUTS, ...LB_MAP_LAYOUTS, ...GUARD_MAP_LAYOUTS };

function mapSample(map: string): unknown {
  const d = mapDeclarations().get(map);
  assert.ok(d, `pinned map ${map} is declared in no bpf/ header`);
  const structOf = (t: string | undefined) => (t?.startsWith('struct ') ? t.slice('struct '.length) : undefined);
  const layout = MAP_LAYOUTS[map];
  const out: Record<string, unknown> = {
    header: d.header,
    declaration: d.decl,
    convert: typeof layout.convert === 'string' ? layout.convert : 'custom',
    from: Object.keys(layout.from ?? {}),
  };
  for (const part of ['key', 'value'] as const) {
    const s = structOf(d.decl[part]);
    if (s) out[`${part}Struct`] = STRUCTS[s] ?? `struct ${s}: no TypeScript mirror`;
  }
  return out;
}

/**
 * A CRD as a format: names, scope, versions, subresources and the schema's structure and rules. Descriptions
 * and printer columns are documentation, not format: left out, so rewording one needs no new version.
 */
function crdSample(kind: string): unknown {
  const strip = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(strip);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).filter(([k]) => k !== 'description' && k !== 'additionalPrinterColumns').map(([k, x]) => [k, strip(x)]));
    return v;
  };
  return strip(crdManifest(CRDS.find((c) => c.kind === kind)!));
}

const CASES: Record<string, Case> = {
  'socket-api': {
    async write() {
      // The request line exactly as the client writes it (its id is per process and time: fixed here).
      const dir = tmp('api');
      const sock = path.join(dir, 's.sock');
      let requestLine = '';
      const srv = net.createServer((s) => {
        s.on('data', (c) => {
          requestLine += c.toString();
          if (requestLine.includes('\n')) s.end(JSON.stringify({ version: 1, id: JSON.parse(requestLine).id, result: { pong: true } }) + '\n');
        });
      });
      await new Promise<void>((r) => srv.listen(sock, r));
      try {
        await callWith(nodeConnector, sock, 'ping', {});
      } finally {
        srv.close();
      }
      const id = JSON.parse(requestLine).id as string;
      // The daemon's answers: a result and a refused version.
      const api = new ApiServer(path.join(dir, 'd.sock'), { ping: () => ({ pong: true, node: 'golden' }) }, makeLogger({ level: 'error' }));
      await api.listen();
      try {
        const answers = await exchange(path.join(dir, 'd.sock'), [
          JSON.stringify({ version: 1, id: 'ID', method: 'ping', params: {} }),
          JSON.stringify({ version: 99, id: 'ID', method: 'ping', params: {} }),
        ]);
        return { 'request.json': requestLine.split(id).join('ID'), 'response.json': answers[0] + '\n', 'refusal.json': answers[1] + '\n' };
      } finally {
        await api.close();
        fs.rmSync(dir, { recursive: true, force: true });
      }
    },
    async read(_v, g) {
      const dir = tmp('api');
      const api = new ApiServer(path.join(dir, 'd.sock'), { ping: () => ({ pong: true, node: 'golden' }) }, makeLogger({ level: 'error' }));
      await api.listen();
      try {
        // The golden request, to this release's daemon.
        const [a] = await exchange(path.join(dir, 'd.sock'), [g['request.json'].toString().trim()]);
        assert.equal(JSON.parse(a), { version: 1, id: 'ID', result: { pong: true, node: 'golden' } });
      } finally {
        await api.close();
      }
      // The golden answer, to this release's client.
      const sock = path.join(dir, 'old.sock');
      const srv = net.createServer((s) => s.on('data', (c) => s.end(g['response.json'].toString().split('"ID"').join(JSON.stringify(JSON.parse(c.toString()).id)))));
      await new Promise<void>((r) => srv.listen(sock, r));
      try {
        assert.equal(await callWith(nodeConnector, sock, 'ping', {}), { pong: true, node: 'golden' });
      } finally {
        srv.close();
        fs.rmSync(dir, { recursive: true, force: true });
      }
    },
  },

  'delete-queue-file': {
    async write() {
      const dir = tmp('dq');
      const q = path.join(dir, 'delete-queue');
      const r = queueDelete(q, QUEUED);
      assert.ok(r.queued, JSON.stringify(r));
      const [name] = fs.readdirSync(q);
      const out = { 'json': fs.readFileSync(path.join(q, name)), 'name.txt': name + '\n' };
      fs.rmSync(dir, { recursive: true, force: true });
      return out;
    },
    async read(v, g) {
      const q = parseQueuedDelete(g['json'].toString());
      assert.equal(q, { format: v, ...QUEUED });
    },
  },

  'pod-record': {
    async write() {
      const dir = tmp('pods');
      new PodStore(dir).put(POD);
      const [name] = fs.readdirSync(path.join(dir, 'pods'));
      const out = { 'json': fs.readFileSync(path.join(dir, 'pods', name)), 'name.txt': name + '\n' };
      fs.rmSync(dir, { recursive: true, force: true });
      return out;
    },
    async read(_v, g) {
      const dir = tmp('pods');
      fs.mkdirSync(path.join(dir, 'pods'));
      fs.writeFileSync(path.join(dir, 'pods', g['name.txt'].toString().trim()), g['json']);
      const s = new PodStore(dir);
      assert.equal(s.load(), { loaded: 1, broken: [] });
      assert.equal(s.get(POD), POD);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  },

  'sysctl-journal': {
    async write() {
      const dir = tmp('sysctl');
      const file = path.join(dir, 'sysctl-journal.json');
      useSysctlJournal(file);
      try {
        journalHostSysctl('net/ipv4/ip_forward', '0', '1');
        journalHostSysctl('net/ipv4/conf/all/rp_filter', '1', '2');
      } finally {
        useSysctlJournal(undefined);
      }
      const out = { json: fs.readFileSync(file) };
      fs.rmSync(dir, { recursive: true, force: true });
      return out;
    },
    async read(_v, g) {
      const dir = tmp('sysctl');
      const file = path.join(dir, 'sysctl-journal.json');
      fs.writeFileSync(file, g['json']);
      assert.equal(readSysctlJournal(file), {
        'net/ipv4/ip_forward': { before: '0', wrote: '1' },
        'net/ipv4/conf/all/rp_filter': { before: '1', wrote: '2' },
      });
      fs.rmSync(dir, { recursive: true, force: true });
    },
  },

  'lb-vip-record': {
    async write() {
      const dir = tmp('lb-vips');
      new VipRecord(dir, makeLogger({ level: 'error' })).save(new Map([['shop/db', { pool: 'lb', vip: '198.51.100.1' }], ['shop/web', { pool: 'lb', vip: '198.51.100.7' }]]));
      const out = { json: fs.readFileSync(path.join(dir, VIP_RECORD_FILE)) };
      fs.rmSync(dir, { recursive: true, force: true });
      return out;
    },
    async read(_v, g) {
      const dir = tmp('lb-vips');
      fs.writeFileSync(path.join(dir, VIP_RECORD_FILE), g['json']);
      const r = new VipRecord(dir, makeLogger({ level: 'error' }));
      assert.is(r.get('shop/db', 'lb'), '198.51.100.1');
      assert.is(r.get('shop/web', 'lb'), '198.51.100.7');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  },

  'ipam-allocation-record': {
    async write() {
      const dir = tmp('ipam');
      const s = new AllocationStore(dir);
      s.create(ALLOC);
      s.saveBlocks(ALLOC.pool, [ALLOC.block, '10.244.1.64/26']);
      s.saveGeneration('generation-token');
      const files: string[] = [];
      const walk = (d: string) => {
        for (const e of fs.readdirSync(d, { withFileTypes: true })) {
          const p = path.join(d, e.name);
          if (e.isDirectory()) walk(p);
          else files.push(path.relative(dir, p));
        }
      };
      walk(dir);
      files.sort();
      const out = { 'json': json(Object.fromEntries(files.map((f) => [f, fs.readFileSync(path.join(dir, f), 'utf8')]))) };
      fs.rmSync(dir, { recursive: true, force: true });
      return out;
    },
    async read(_v, g) {
      const dir = tmp('ipam');
      for (const [f, text] of Object.entries(JSON.parse(g['json'].toString()) as Record<string, string>)) {
        fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
        fs.writeFileSync(path.join(dir, f), text);
      }
      const s = new AllocationStore(dir);
      assert.equal(s.loadAll(), { records: [ALLOC], broken: [] });
      assert.equal(s.loadBlocks(ALLOC.pool), [ALLOC.block, '10.244.1.64/26']);
      assert.is(s.loadGeneration(), 'generation-token');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  },

  'node-registry': {
    async write() {
      const prefix = freshPrefix();
      await new NodeRegistry(raw, prefix, 'node-a', '192.0.2.1').beat(15_000);
      await new NodeRegistry(raw, prefix, 'node-b', '192.0.2.2').beat(15_000);
      return { json: json(await dump(prefix)) };
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      // And a registration as release 0.1.0 wrote it (no release): read, with no release.
      await raw.hset(nodesKey(prefix), 'node-old', JSON.stringify({ address: '192.0.2.9' }));
      await raw.zadd(`${nodesKey(prefix)}:expiry`, Date.now() + 60_000, 'node-old');
      // And one whose release this reader does not understand (a later shape): its address still counts.
      await raw.hset(nodesKey(prefix), 'node-next', JSON.stringify({ address: '192.0.2.8', release: { name: '9.9.9' } }));
      await raw.zadd(`${nodesKey(prefix)}:expiry`, Date.now() + 60_000, 'node-next');
      const reg = new NodeRegistry(raw, prefix, 'node-c', '192.0.2.3');
      assert.equal(await reg.beat(15_000), ['192.0.2.1', '192.0.2.2', '192.0.2.3', '192.0.2.8', '192.0.2.9']);
      assert.equal(Object.fromEntries(reg.releases()), { 'node-a': RELEASE, 'node-b': RELEASE, 'node-c': RELEASE, 'node-next': '', 'node-old': '' });
    },
  },

  'gateway-registry': {
    async write() {
      const prefix = freshPrefix();
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        await s.registerGateways(EGRESS, 'node-a', [GW], 15_000);
        return { json: json(await dump(prefix)) };
      } finally {
        await s.close();
      }
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        assert.equal(await s.listGateways(EGRESS), [GW]);
      } finally {
        await s.close();
      }
    },
  },

  'egress-ownership-record': {
    async write() {
      const prefix = freshPrefix();
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        await s.record(OWNED);
        return { json: json(await dump(prefix)) };
      } finally {
        await s.close();
      }
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        const { score: _score, ...want } = OWNED;
        assert.equal(await s.get(OWNED.egress, OWNED.address), want);
      } finally {
        await s.close();
      }
    },
  },

  'egress-ownership-pubsub': {
    async write() {
      const prefix = freshPrefix();
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        const [msg] = await published(`${prefix}egress-ownership`, async () => void (await s.record(OWNED)));
        return { json: json({ channel: '<prefix>egress-ownership', message: msg }) };
      } finally {
        await s.close();
      }
    },
    async read(_v, g) {
      const { channel, message } = JSON.parse(g['json'].toString()) as { channel: string; message: string };
      const { score: _score, ...want } = OWNED;
      assert.equal(readNotice(channel, message), want);
    },
  },

  'egress-usage-report': {
    async write() {
      const prefix = freshPrefix();
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        await s.reportUsage(EGRESS, 'node-a', USAGE, 15_000);
        return { json: json(await dump(prefix)) };
      } finally {
        await s.close();
      }
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
      try {
        assert.equal(await s.usage(EGRESS), USAGE);
      } finally {
        await s.close();
      }
    },
  },

  'ipam-store': {
    async write() {
      const prefix = freshPrefix();
      const s = await RedisStore.connect(redis.url, { keyPrefix: prefix });
      try {
        await ipamSample(s);
        return { json: json(await dump(prefix, { [(await s.generation()).token]: '<token>' })) };
      } finally {
        await s.close();
      }
    },
    writeOld: {
      // Compat mode (a store that still has keys of tetherds from before issue 21): the untagged twins.
      1: async () => {
        const prefix = freshPrefix();
        await raw.set(`${prefix}generation`, 'golden-token');
        const s = await RedisStore.connect(redis.url, { keyPrefix: prefix });
        try {
          await ipamSample(s);
          const all = await dump(prefix, { 'golden-token': '<token>' });
          return { json: json(Object.fromEntries(Object.entries(all).filter(([k]) => !k.includes('{')))) };
        } finally {
          await s.close();
        }
      },
    },
    async read(v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix, { 'golden-token': '<token>' });
      const s = await RedisStore.connect(redis.url, { keyPrefix: prefix });
      try {
        assert.equal(Object.fromEntries(await s.listBlocks('pods-a')), { '10.244.1.0/26': 'node-a' });
        assert.equal(Object.fromEntries(await s.listAddresses('floating')), { '192.0.2.10': 'egress/out' });
        assert.is((await s.generation()).token, 'golden-token', `version ${v}: the generation is carried over`);
      } finally {
        await s.close();
      }
    },
  },

  'lb-mapping-store': {
    async write() {
      const prefix = freshPrefix();
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        await s.mappings.claim(VIP, MAPPINGS, 1_700_000_000_000);
        await s.mappings.claim(VIP6, MAPPINGS6, 1_700_000_000_000);
        assert.ok(await s.leases.take(VIP, 'node-a', 30_000));
        return { json: json(await dump(prefix)) };
      } finally {
        await s.connection.close();
      }
    },
    async read(v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        const { mappings, garbled } = await s.mappings.load(VIP);
        assert.is(garbled, 0);
        const byField = (a: StoredMapping[]) => [...a].sort((x, y) => JSON.stringify(x).localeCompare(JSON.stringify(y)));
        assert.equal(byField(mappings), byField(MAPPINGS));
        const six = await s.mappings.load(VIP6);
        assert.equal([six.garbled, byField(six.mappings)], [0, v >= 2 ? byField(MAPPINGS6) : []]);
        assert.not.ok(await s.leases.take(VIP, 'node-b', 30_000), 'the lease is held by node-a');
      } finally {
        await s.connection.close();
      }
    },
  },

  'lb-mapping-notice': {
    async write() {
      const prefix = freshPrefix();
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        const [msg] = await published(s.notices.channel(VIP), async () => void (await s.mappings.claim(VIP, MAPPINGS, 1_700_000_000_000)));
        const [msg6] = await published(s.notices.channel(VIP6), async () => void (await s.mappings.claim(VIP6, MAPPINGS6, 1_700_000_000_000)));
        return { json: json({ channel: s.notices.channel(VIP).replace(prefix, '<prefix>'), message: msg, ipv6: { channel: s.notices.channel(VIP6).replace(prefix, '<prefix>'), message: msg6 } }) };
      } finally {
        await s.connection.close();
      }
    },
    async read(v, g) {
      const { channel, message, ipv6 } = JSON.parse(g['json'].toString()) as { channel: string; message: string; ipv6?: { channel: string; message: string } };
      const prefix = freshPrefix();
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        assert.is(s.notices.channel(VIP), channel.replace('<prefix>', prefix));
        await s.notices.serve([VIP, VIP6]);
        await waitFor(() => s.notices.hears(VIP) && s.notices.hears(VIP6), "subscribed", { timeoutMs: 3000 });
        const got: StoredMapping[] = [];
        s.notices.on('mapping', (m: StoredMapping) => got.push(m));
        s.notices.on('garbled', (m: string) => assert.unreachable(`garbled: ${m}`));
        await raw.publish(s.notices.channel(VIP), message);
        await waitFor(() => got.length === MAPPINGS.length, "the notice", { timeoutMs: 3000 });
        assert.equal(got, MAPPINGS);
        assert.is(ipv6 !== undefined, v >= 2, 'version 2 has an IPv6 VIP\'s notice');
        if (ipv6) {
          assert.is(s.notices.channel(VIP6), ipv6.channel.replace('<prefix>', prefix));
          await raw.publish(s.notices.channel(VIP6), ipv6.message);
          await waitFor(() => got.length === MAPPINGS.length + MAPPINGS6.length, "the IPv6 notice", { timeoutMs: 3000 });
          assert.equal(got.slice(MAPPINGS.length), MAPPINGS6);
        }
      } finally {
        await s.connection.close();
      }
    },
  },

  'lb-table-version': {
    async write() {
      const prefix = freshPrefix();
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        const opts = { memberTtlMs: 8000, keyTtlMs: 120_000, nowMs: 1_700_000_000_000 };
        await s.tables.step(VIP, 'node-a', '10.244.1.5,10.244.2.5', opts);
        await s.tables.step(VIP, 'node-a', '10.244.1.5,10.244.2.5,10.244.3.5', { ...opts, nowMs: opts.nowMs + 100 });
        return { json: json(await dump(prefix)) };
      } finally {
        await s.connection.close();
      }
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        const opts = { memberTtlMs: 8000, keyTtlMs: 120_000, nowMs: 1_700_000_001_000 };
        const st = await s.tables.step(VIP, 'node-b', '10.244.1.5,10.244.2.5,10.244.3.5', opts);
        assert.equal(st.active, { version: 1, atMs: 1_700_000_000_000, row: '10.244.1.5,10.244.2.5' });
        assert.equal(st.next, { version: 2, atMs: 1_700_000_000_100, row: '10.244.1.5,10.244.2.5,10.244.3.5' });
        assert.is(st.members, 2);
        assert.equal([...st.waiting].sort(), ['node-a', 'node-b']);
      } finally {
        await s.connection.close();
      }
    },
  },

  'lb-health-report': {
    async write() {
      const prefix = freshPrefix();
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        await new HealthReports(s.connection).write('node-a', HEALTH, 15_000);
        return { json: json(await dump(prefix)) };
      } finally {
        await s.connection.close();
      }
    },
    async read(_v, g) {
      const prefix = freshPrefix();
      await restore(JSON.parse(g['json'].toString()), prefix);
      const s = await connectLbStore(redis.url, { keyPrefix: prefix });
      try {
        assert.equal(await new HealthReports(s.connection).read(), { 'node-a': HEALTH });
      } finally {
        await s.connection.close();
      }
    },
  },

  'ownership-notice': {
    async write() {
      return { bin: encodeNotices(noticeKey(KEY32), ENVELOPE) };
    },
    async read(_v, g) {
      assert.equal(decodeNotices(noticeKey(KEY32), g['bin']), ENVELOPE);
    },
  },

  'bfd-control': {
    async write() {
      const plain = encodeControl(BFD);
      const signed = signPacket(BFD_AUTH, encodeControl({ ...BFD, auth: { type: BFD_AUTH.type, keyId: BFD_AUTH.keyId, seq: 42, digest: Buffer.alloc(BFD_AUTH.digestLen) } }));
      return { 'bin': plain, 'auth.bin': signed };
    },
    async read(_v, g) {
      assert.equal(decodeControl(g['bin']), BFD);
      const signed = decodeControl(g['auth.bin']);
      assert.is(signed.auth?.seq, 42);
      assert.ok(verifyDigest(BFD_AUTH, g['auth.bin']), 'the golden signed packet verifies');
    },
  },

  'conntrack-sync-frame': {
    async write() {
      const w = new FrameWriter(Buffer.from('node-a'), KEY32);
      const hello = w.build(FrameType.HELLO, 128, (b, o) => writeHello(b, o, NONCE, 'egress/out 192.0.2.10', 7));
      const events = w.build(FrameType.EVENTS, 4 + MAX_EVENT_BYTES * SYNC_EVENTS.length, (b, o) => {
        const r = writeList(b, o, o + 4 + MAX_EVENT_BYTES * SYNC_EVENTS.length, SYNC_EVENTS, 0, 100, writeEvent, (_e, err) => assert.unreachable(err.message));
        return r.end;
      });
      const heartbeat = w.build(FrameType.HEARTBEAT, 0);
      return { 'hello.bin': hello, 'events.bin': events, 'heartbeat.bin': heartbeat };
    },
    async read(_v, g) {
      const h = openFrame(g['hello.bin'], KEY32);
      assert.equal([h.type, h.seq, h.sender.toString()], [FrameType.HELLO, 0, 'node-a']);
      assert.equal(readHello(h.payload), { nonceS: NONCE, stream: 'egress/out 192.0.2.10', epoch: 7 });
      const e = openFrame(g['events.bin'], KEY32);
      assert.equal([e.type, e.seq], [FrameType.EVENTS, 1]);
      assert.equal(readList(e.payload, 100, readEvent), SYNC_EVENTS);
      const hb = openFrame(g['heartbeat.bin'], KEY32);
      assert.equal([hb.type, hb.seq, hb.payload.length], [FrameType.HEARTBEAT, 2, 0]);
    },
  },
};

const OWNED = {
  egress: EGRESS,
  address: '192.0.2.10',
  owner: 'egress/gw-0',
  epoch: 3,
  cause: 'failover',
  score: '0001',
  ownerNode: 'node-a',
  ownerNodeAddress: '192.0.2.1',
  ownerPodIp: '10.244.1.9',
};
const USAGE = { '192.0.2.10': { flows: 12, bytes: 3400 } };
const VIP = '203.0.113.80';
const MAPPINGS: StoredMapping[] = [
  { key: { vip: VIP, client: '198.51.100.20', vport: 0, cport: 0, proto: 0 }, target: '10.244.2.7' },
  { key: { vip: VIP, client: '198.51.100.21', vport: 443, cport: 50000, proto: 6 }, target: '10.244.3.8' },
];
/** An IPv6 VIP's mappings (version 2): its clients in brackets in the fields, IPv6 targets. */
const VIP6 = '2001:db8:80::80';
const MAPPINGS6: StoredMapping[] = [
  { key: { vip: VIP6, client: '2001:db8:51::20', vport: 0, cport: 0, proto: 0 }, target: 'fd00:244:2::7' },
  { key: { vip: VIP6, client: '2001:db8:51::21', vport: 443, cport: 50000, proto: 6 }, target: 'fd00:244:3::8' },
];
const HEALTH = { eligible: true, healthy: true, services: { 'default/web': { port: 31000, open: true, localEndpoints: 2, status: 200 } } };
const ENVELOPE = {
  from: 'node-a',
  boot: '0123456789abcdef',
  seq: 5,
  at: 1_700_000_000_000,
  notices: [
    { egress: EGRESS, address: '192.0.2.10', owner: 'egress/gw-0', epoch: 3, ownerNode: 'node-a', ownerNodeAddress: '192.0.2.1', ownerPodIp: '10.244.1.9', cause: 'failover', inSync: ['node-b'] },
  ],
  gateways: [{ ...GW, egress: EGRESS }],
  clients: [EGRESS],
};

async function ipamSample(s: RedisStore): Promise<void> {
  await s.generation();
  assert.ok(await s.claimBlock('pods-a', '10.244.1.0/26', 'node-a'));
  const r = await s.allocateAddresses('floating', 'egress/out', { explicit: ['192.0.2.10'] });
  assert.ok('addresses' in r || JSON.stringify(r).includes('192.0.2.10'), JSON.stringify(r));
}

/** Sends lines on one connection to a socket; returns one answer line per request. */
function exchange(sock: string, lines: string[]): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: sock });
    let buf = '';
    const out: string[] = [];
    s.on('connect', () => s.write(lines.map((l) => l + '\n').join('')));
    s.on('data', (c) => {
      buf += c.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        out.push(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
      if (out.length === lines.length) {
        s.destroy();
        resolve(out);
      }
    });
    s.on('error', reject);
  });
}

// Pinned maps and CRDs: the sample is their declaration as the code states it.
for (const f of FORMATS) {
  if (f.kind === 'pinned map') {
    const map = f.name.slice('map-'.length);
    CASES[f.name] = {
      async write() {
        return { json: json(mapSample(map)) };
      },
      async read(v, g) {
        // A pin of an older version is converted (map-layout.ts); the golden still names the same map.
        const old = JSON.parse(g['json'].toString()) as { declaration: Record<string, string> };
        assert.ok(old.declaration.type, `${f.name} v${v}: a map type`);
        assert.ok(v === f.version || (MAP_LAYOUTS[map].from ?? {})[v] !== undefined, `${f.name}: version ${v} has a converter`);
      },
    };
  } else if (f.kind === 'CRD') {
    const kind = CRDS.find((c) => `crd-${c.kind.toLowerCase()}` === f.name)!.kind;
    CASES[f.name] = {
      async write() {
        return { json: json(crdSample(kind)) };
      },
      async read(v, g) {
        // The served schema still takes what the golden's schema required: the golden's own minimal object.
        const crd = JSON.parse(g['json'].toString()) as { spec: { versions: Array<{ name: string; served: boolean }> } };
        assert.ok(crd.spec.versions.some((x) => x.served), `${f.name} v${v}: a served version`);
        const served = (crdManifest(CRDS.find((c) => c.kind === kind)!) as typeof crd).spec.versions.filter((x) => x.served).map((x) => x.name);
        for (const x of crd.spec.versions.filter((x) => x.served)) assert.ok(served.includes(x.name), `${f.name}: ${x.name} is still served`);
      },
    };
  }
}

// ---------------------------------------------------------------------------------------------------
// The tests

test('the registry: unique names, each version read, and a sample and reader for every entry', () => {
  const names = FORMATS.map((f) => f.name);
  assert.equal(names.length, new Set(names).size, 'format names are unique');
  for (const f of FORMATS) {
    assert.ok(f.reads.includes(f.version), `${f.name}: reads its own version`);
    assert.ok(f.definedIn.length > 0, `${f.name}: definedIn`);
    for (const file of f.definedIn) assert.ok(fs.existsSync(path.join(ROOT, file)), `${f.name}: ${file} exists`);
    assert.ok(CASES[f.name], `${f.name}: formats.test.ts has no sample and reader for it`);
    assert.ok(f.history[f.version], `${f.name}: history says what version ${f.version} is`);
  }
  for (const n of Object.keys(CASES)) assert.ok(names.includes(n), `formats.test.ts has a case for ${n}, which the registry does not list`);
});

for (const f of FORMATS) {
  test(`${f.name} v${f.version} (${f.kind}) is written exactly as its golden`, async () => {
    checkGolden(f.name, f.version, await CASES[f.name].write());
  });
  for (const [v, write] of Object.entries(CASES[f.name]?.writeOld ?? {})) {
    test(`${f.name} v${v}, still written beside v${f.version}, is written exactly as its golden`, async () => {
      checkGolden(f.name, Number(v), await write());
    });
  }
  for (const v of f.reads) {
    test(`${f.name}: the golden of v${v} is read by this release`, async () => {
      await CASES[f.name].read(v, goldenParts(f.name, v));
    });
  }
}

test('no golden of a version the registry neither writes nor reads is left unexplained', () => {
  for (const f of FORMATS) {
    const dir = path.join(FIXTURES, f.name);
    if (!fs.existsSync(dir)) continue;
    for (const file of fs.readdirSync(dir)) {
      const v = Number(/^v(\d+)\./.exec(file)?.[1]);
      assert.ok(f.reads.includes(v) || v < Math.min(...f.reads), `${f.name}/${file}: version ${v} is newer than this release writes`);
    }
  }
  for (const d of fs.readdirSync(FIXTURES)) assert.ok(FORMATS.some((f) => f.name === d), `test/fixtures/formats/${d}: no such format in the registry`);
});

// ---------------------------------------------------------------------------------------------------
// Completeness: modules that define a shared format must be named by the registry.

/** Modules that match a signal below but define nothing another release reads, and why. */
const NOT_SHARED: Record<string, string> = {
  'lib/ip.ts': 'prefix means an address prefix length, not a store key',
  'lib/atomic-file.ts': 'the writer every state record uses; the records are listed',
  'daemon/sys/ffi.ts': 'writes a temporary copy of a native library',
  'daemon/sys/netns.ts': 'writes /proc and /sys files of the kernel',
  'lib/api/client.ts': 'the Node transport of the socket API (call-core.ts defines it)',
  'daemon/health/health-server.ts': 'HTTP health checks for external load balancers (200/503), not between releases',
  'daemon/health/probe-server.ts': 'kubelet probes (/healthz, /readyz), not between releases',
  'daemon/health/health-controller.ts': 'listens for health checks; its report is listed under lb-health-report',
  'daemon/parts/api.ts': 'starts the probe server',
  'daemon/parts/metrics.ts': 'Prometheus metrics, not between releases',
  'daemon/main.ts': 'starts the socket API server',
  'daemon/egress/egress-controller.ts': 'starts the sync receiver (conntrack-sync-frame)',
  'daemon/conntrack-sync/receiver.ts': 'the sync receiver\'s socket; its frames are conntrack-sync-frame',
  'daemon/bfd/endpoint.ts': 'the BFD socket; its packets are bfd-control',
};

/** What gives a module away as defining a shared format. */
const SIGNALS: Array<[string, RegExp]> = [
  ['a store key built from the prefix', /\$\{(this\.)?prefix\}/],
  ['a file it writes', /writeFileAtomic\(|fs\.writeSync\(|writeFileSync\(|appendFileSync\(|\blinkSync\(/],
  ['a pub/sub message', /\b(s?publish)\(|'PUBLISH'/],
  ['a socket it speaks on', /createSocket\(|createServer\(|\.listen\(/],
  ['a binary encoder of a versioned wire format', /\bVERSION\b\s*=\s*\d|PROTOCOL_VERSION\s*=|_FORMAT\s*=/],
];

function sources(): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(path.join(ROOT, d), { withFileTypes: true })) {
      const p = `${d}/${e.name}`;
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) out.push(p);
    }
  };
  for (const d of ['daemon', 'ipam', 'cni']) walk(d);
  return out.sort();
}

test('every module that defines a shared format is in the registry (or in NOT_SHARED with a reason)', () => {
  const listed = new Set(FORMATS.flatMap((f) => f.definedIn));
  const missing: string[] = [];
  for (const file of sources()) {
    if (listed.has(file) || NOT_SHARED[file] || file === 'daemon/formats.ts') continue;
    const text = fs.readFileSync(path.join(ROOT, file), 'utf8');
    const why = SIGNALS.filter(([, re]) => re.test(text)).map(([w]) => w);
    if (why.length) missing.push(`${file} (${why.join(', ')})`);
  }
  assert.equal(missing, [], `modules that look like they define a shared format but daemon/formats.ts does not name: add an entry (or a NOT_SHARED reason here)`);
  for (const f of Object.keys(NOT_SHARED)) assert.ok(fs.existsSync(path.join(ROOT, f)), `NOT_SHARED names ${f}, which is gone`);
});

test('every pinned map declared in bpf/ and every CRD kind is in the registry', () => {
  const maps = [...mapDeclarations().keys()].sort();
  const listed = FORMATS.filter((f) => f.kind === 'pinned map').map((f) => f.name.slice('map-'.length));
  // Maps tetherd pins are those with a layout; any other declared map would be pinned as UNDECLARED version 1.
  assert.equal(maps.filter((m) => !listed.includes(m)), [], 'maps declared in bpf/ without an entry (add it to its *_MAP_LAYOUTS)');
  for (const c of CRDS) assert.ok(FORMATS.some((f) => f.name === `crd-${c.kind.toLowerCase()}`), `CRD ${c.kind}`);
  assert.ok(formatNamed('socket-api'));
});

test.run();
