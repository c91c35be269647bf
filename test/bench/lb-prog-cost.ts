// Benchmark (not a test): what the node program (bpf/lb.bpf.c lb_node) costs per packet, in the kernel and
// without the network, for a 64-byte UDP datagram to an IPv4 VIP and to an IPv6 VIP whose client already has
// a mapping to a remote target. Two namespaces as test/kernel/lb-node.test.ts wires them (router ── lbnode,
// the targets behind the router); the program is run by BPF_PROG_TEST_RUN on a frame "received" on the
// node's uplink (the skb's device is the uplink, so the FIB lookup, the MTU check and pkt_type are the real
// ones); the redirect is only decided (TC_ACT_REDIRECT), not carried out, as at the real attach point,
// where it happens after the program.
// BPF_PROG_TEST_RUN runs its repetitions on the same skb, and the first run encapsulates it (the others
// would then time a non-VIP packet): so each run is one call with repeat 1, and the kernel's duration of
// each (the program plus a fixed cost of the test harness: its clock reads, bh disable) is kept. The
// median of those is the figure; a frame to a non-VIP address (one map lookup, then pass) shows the floor.
// Run (as root): node_modules/.bin/tsx test/bench/lb-prog-cost.ts [--runs N] [--object path/to/lb.bpf.o] [--json]
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbDatapath } from '../../daemon/bpf/lb';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { PROTO } from '../../daemon/bpf/lb-structs';
import { maglevTable } from '../../daemon/lb/maglev';
import { inNetns } from '../../daemon/sys/netns';
import { koffi } from '../../daemon/sys/ffi';
import { addNetns, delNetns, ipJson, linkMac, uniqueName } from '../lib/netns';
import { frame as ipFrame, udp } from '../lib/ip-frames';

const repo = path.resolve(__dirname, '../..');
const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const RUNS = Number(arg('--runs') ?? 100000);
const OBJECT = arg('--object');
const JSON_OUT = process.argv.includes('--json');

const PORT = 8080;
const FOU_PORT = 5557;
const M = 251;
const TC_ACT_OK = 0;
const TC_ACT_REDIRECT = 7;

interface Family { name: string; v6: boolean; vip: string; node: string; router: string; client: string; other: string; targets: string[]; slot: number }
const V4: Family = { name: 'IPv4', v6: false, vip: '10.93.100.10', node: '10.93.2.2', router: '10.93.2.1', client: '10.93.1.2', other: '10.93.1.9', targets: ['10.93.3.2', '10.93.4.2'], slot: 0 };
const V6: Family = { name: 'IPv6', v6: true, vip: 'fd93:100::10', node: 'fd93:2::2', router: 'fd93:2::1', client: 'fd93:1::2', other: 'fd93:1::9', targets: ['fd93:3::2', 'fd93:4::2'], slot: 1 };

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const inNs = (ns: string, ...cmd: string[]) => sh('nsenter', `--net=/run/netns/${ns}`, ...cmd);

/** A 64-byte UDP datagram from src:40000 to dst:PORT in an Ethernet frame to the node's uplink (UDP checksum 0: the program does not read it). */
function frame(src: string, dst: string, dstMac: Buffer, srcMac: Buffer): Buffer {
  return ipFrame({ src, dst, proto: PROTO.UDP, payload: udp(40000, PORT, Buffer.alloc(64, 0x41)), dstMac, srcMac });
}

/** libbpf's bpf_prog_test_run_opts and bpf_prog_get_fd_by_id (struct bpf_test_run_opts as in libbpf's bpf.h). */
function testRunner() {
  const k = koffi();
  const so = k.load('libbpf.so.1');
  const opts = k.struct('tether_bpf_test_run_opts', {
    sz: 'size_t', data_in: 'void *', data_out: 'void *', data_size_in: 'uint32_t', data_size_out: 'uint32_t',
    ctx_in: 'void *', ctx_out: 'void *', ctx_size_in: 'uint32_t', ctx_size_out: 'uint32_t',
    retval: 'uint32_t', repeat: 'int', duration: 'uint32_t', flags: 'uint32_t', cpu: 'uint32_t', batch_size: 'uint32_t',
  });
  const run = so.func('int bpf_prog_test_run_opts(int prog_fd, _Inout_ tether_bpf_test_run_opts *opts)');
  const fdById = so.func('int bpf_prog_get_fd_by_id(uint32_t id)');
  return { sz: k.sizeof(opts), run, fdById };
}

interface Timing { median: number; p10: number; p90: number; mean: number; retval: number }

/**
 * Runs the program runs times on data (a fresh skb each time, on ifindex) and returns the kernel's
 * per-run durations' median and spread, and the last verdict.
 */
function time(r: ReturnType<typeof testRunner>, progFd: number, data: Buffer, ifindex: number, runs: number): Timing {
  // struct __sk_buff up to ifindex (offset 40): a shorter ctx is zero-filled by the kernel.
  const ctx = Buffer.alloc(44);
  ctx.writeUInt32LE(ifindex, 40);
  const out = Buffer.alloc(data.length + 256);
  const d = new Uint32Array(runs);
  let retval = -1;
  for (let i = 0; i < runs; i++) {
    const o = {
      sz: r.sz, data_in: data, data_out: out, data_size_in: data.length, data_size_out: out.length,
      ctx_in: ctx, ctx_out: null, ctx_size_in: ctx.length, ctx_size_out: 0, retval: 0, repeat: 1, duration: 0, flags: 0, cpu: 0, batch_size: 0,
    };
    const rc = r.run(progFd, o) as number;
    if (rc !== 0) throw new Error(`bpf_prog_test_run_opts: ${rc}`);
    d[i] = o.duration;
    retval = o.retval;
  }
  const sorted = Array.from(d).sort((a, b) => a - b);
  const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
  return { median: q(0.5), p10: q(0.1), p90: q(0.9), mean: Math.round(sorted.reduce((a, b) => a + b, 0) / sorted.length), retval };
}

async function main(): Promise<void> {
  if (!OBJECT && !fs.existsSync(path.join(repo, 'dist/bpf/lb.bpf.o'))) execFileSync('bash', [path.join(repo, 'bpf/build.sh')], { stdio: 'inherit' });
  const router = uniqueName('lpc-router');
  const node = uniqueName('lpc-node');
  const pinDir = `/sys/fs/bpf/tether-test/${uniqueName('lpc')}`;
  let lb: LbDatapath | undefined;
  try {
    for (const ns of [router, node]) {
      addNetns(ns);
      for (const k of ['net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']) inNs(ns, 'sysctl', '-qw', k);
    }
    sh('ip', '-n', router, 'link', 'add', 'rn', 'type', 'veth', 'peer', 'name', 'n0', 'netns', node);
    sh('ip', '-n', router, 'addr', 'add', `${V4.router}/24`, 'dev', 'rn');
    sh('ip', '-n', router, 'addr', 'add', `${V6.router}/64`, 'dev', 'rn', 'nodad');
    sh('ip', '-n', node, 'addr', 'add', `${V4.node}/24`, 'dev', 'n0');
    sh('ip', '-n', node, 'addr', 'add', `${V6.node}/64`, 'dev', 'n0', 'nodad');
    for (const ns of [router, node]) sh('ip', '-n', ns, 'link', 'set', ns === router ? 'rn' : 'n0', 'up');
    sh('ip', '-n', node, 'route', 'add', 'default', 'via', V4.router);
    sh('ip', '-n', node, '-6', 'route', 'add', 'default', 'via', V6.router);
    // The router's MAC known for good: every lookup then finds its neighbour (BPF_FIB_LKUP_RET_SUCCESS).
    const routerMac = linkMac(router, 'rn');
    const nodeMac = linkMac(node, 'n0');
    const mac = [...routerMac].map((b) => b.toString(16).padStart(2, '0')).join(':');
    for (const f of [V4, V6]) sh('ip', '-n', node, 'neigh', 'replace', f.router, 'lladdr', mac, 'dev', 'n0', 'nud', 'permanent');
    const ifindex = ipJson(node, ['link', 'show', 'n0'])[0].ifindex as number;

    ensureBpffs(pinDir);
    lb = LbDatapath.load({ pinDir, maxVips: 4, maglevSize: M, objectPath: OBJECT });
    lb.configure(V4.node, FOU_PORT, V6.node);
    for (const f of [V4, V6]) {
      lb.setService(f.vip, f.slot, [{ port: PORT, proto: PROTO.UDP }], 0);
      lb.setTargets(f.vip, new Map(f.targets.map((t) => [t, 'active'] as const)));
      const mg = maglevTable(f.targets, M);
      lb.setMaglevRow(f.slot, mg.table, mg.targets);
    }
    const att = lb.attachNode('n0', `/run/netns/${node}`);
    const r = testRunner();
    const progFd = r.fdById(att.progId) as number;
    if (progFd < 0) throw new Error(`bpf_prog_get_fd_by_id(${att.progId}): ${progFd}`);

    const results: Record<string, Timing & { pps?: number }> = {};
    inNetns(`/run/netns/${node}`, () => {
      for (const f of [V4, V6]) {
        const vipFrame = frame(f.client, f.vip, nodeMac, routerMac);
        // The first run picks the client's target and records the mapping: what follows is the established case.
        time(r, progFd, vipFrame, ifindex, 100);
        if (!lb!.mappings().some((m) => m.vip === f.vip && m.client === f.client)) throw new Error(`${f.name}: no mapping after the first packet`);
        const before = lb!.stats(f.slot);
        const t = time(r, progFd, vipFrame, ifindex, RUNS);
        const after = lb!.stats(f.slot);
        if (t.retval !== TC_ACT_REDIRECT) throw new Error(`${f.name}: verdict ${t.retval}, not TC_ACT_REDIRECT`);
        if (after.packets - before.packets !== BigInt(RUNS) || after.dropNoRoute !== before.dropNoRoute) {
          throw new Error(`${f.name}: ${RUNS} runs counted ${after.packets - before.packets} packets forwarded, ${after.dropNoRoute - before.dropNoRoute} without a route`);
        }
        results[`${f.name} VIP`] = t;
        const pass = time(r, progFd, frame(f.client, f.other, nodeMac, routerMac), ifindex, Math.min(RUNS, 20000));
        if (pass.retval !== TC_ACT_OK) throw new Error(`${f.name}: non-VIP verdict ${pass.retval}`);
        results[`${f.name} non-VIP (floor)`] = pass;
      }
    });
    if (JSON_OUT) {
      process.stdout.write(`${JSON.stringify({ runs: RUNS, object: OBJECT ?? 'dist/bpf/lb.bpf.o', results })}\n`);
    } else {
      process.stdout.write(`lb_node per packet, ${RUNS} runs each (ns: median [p10..p90], mean)\n`);
      for (const [k, t] of Object.entries(results)) process.stdout.write(`  ${k.padEnd(22)} ${String(t.median).padStart(5)} [${t.p10}..${t.p90}] mean ${t.mean}\n`);
      const v4 = results['IPv4 VIP'].median;
      const v6 = results['IPv6 VIP'].median;
      process.stdout.write(`  IPv6 / IPv4: ${(v6 / v4).toFixed(2)}\n`);
    }
  } finally {
    try {
      lb?.detachNode('n0', `/run/netns/${node}`);
      lb?.close({ unpin: true });
    } catch {
      // the namespaces go next
    }
    delNetns(router, node);
    fs.rmSync(pinDir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
