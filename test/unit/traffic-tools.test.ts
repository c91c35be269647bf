// The testbed's traffic tools (test/lib/traffic.ts) on loopback: the echo server records sources of both
// families (IPv4 in the "addr:port" form callers already parse, IPv6 as "[addr]:port"), and the client keeps
// its connections and UDP stream intact to an address of either family.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ChildProcess, spawn } from 'node:child_process';
import { ECHO_SERVER, peerAddress, TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';
import { freePort } from '../lib/ports';

function output(child: ChildProcess): Promise<string> {
  return new Promise((resolve) => {
    let out = '';
    child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr?.on('data', (b: Buffer) => (out += b.toString()));
    child.once('exit', () => resolve(out));
  });
}

async function withEchoServer(fn: (port: number) => Promise<void>): Promise<string[]> {
  const port = await freePort();
  const server = spawn(process.execPath, ['-e', ECHO_SERVER, String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const out = output(server);
  try {
    await new Promise<void>((resolve, reject) => {
      server.stdout!.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
      server.once('exit', (code) => reject(new Error(`echo server exited (${code})`)));
    });
    await fn(port);
  } finally {
    server.kill('SIGTERM');
  }
  const line = (await out).split('\n').find((l) => l.startsWith('{'));
  return line ? (JSON.parse(line) as { peers: string[] }).peers : [];
}

async function traffic(host: string, port: number, conns: number, udp: boolean): Promise<TrafficReport> {
  const text = await output(spawn(process.execPath, ['-e', TRAFFIC_CLIENT, host, String(port), String(conns), '600', '20', udp ? '1' : '0'], { stdio: ['ignore', 'pipe', 'pipe'] }));
  const line = text.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`no report: ${text}`);
  return JSON.parse(line) as TrafficReport;
}

test('one echo server takes both families; sources recorded per family, IPv4 in its old form', async () => {
  let r4: TrafficReport | undefined;
  let r6: TrafficReport | undefined;
  const peers = await withEchoServer(async (port) => {
    r4 = await traffic('127.0.0.1', port, 2, true);
    r6 = await traffic('::1', port, 2, true);
  });
  for (const [name, r] of [['IPv4', r4], ['IPv6', r6]] as const) {
    assert.is(r?.intact, 2, `${name}: ${r?.errors.join('; ')}`);
    assert.ok((r?.echoes ?? 0) >= 10, `${name}: echoes ${r?.echoes}`);
    assert.ok((r?.udp?.received ?? 0) > 0, `${name} UDP: ${JSON.stringify(r?.udp)}`);
  }
  const tcp = peers.filter((p) => !p.startsWith('udp '));
  const udp = peers.filter((p) => p.startsWith('udp '));
  assert.is(tcp.filter((p) => /^127\.0\.0\.1:\d+$/.test(p)).length, 2, `IPv4 connections as addr:port: ${peers.join(', ')}`);
  assert.is(tcp.filter((p) => /^\[::1\]:\d+$/.test(p)).length, 2, `IPv6 connections as [addr]:port: ${peers.join(', ')}`);
  assert.equal(udp.map(peerAddress).sort(), ['127.0.0.1', '::1']);
  assert.equal([...new Set(peers.map(peerAddress))].sort(), ['127.0.0.1', '::1']);
});

test('peerAddress', () => {
  assert.is(peerAddress('10.244.1.2:40000'), '10.244.1.2');
  assert.is(peerAddress('udp 10.244.1.2:40000'), '10.244.1.2');
  assert.is(peerAddress('[fd00:10:244::5]:40000'), 'fd00:10:244::5');
  assert.is(peerAddress('udp [fd00:10:244::5]:53'), 'fd00:10:244::5');
});

test.run();
