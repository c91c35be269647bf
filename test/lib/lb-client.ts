// The TCP client of the LB kernel tests (lb-datapath, lb-node), run inside a namespace: one connection per
// source address to host:port, each sending one request line; prints {src, ok, who, peer, bytes} per connection,
// where the target's answer line is "<who> <peer>".
import { execFileSync } from 'node:child_process';

const CLIENT_JS = `
const net = require('net');
const [host, port, srcs, req, timeout] = process.argv.slice(1);
let left = 0;
for (const src of srcs.split(',')) {
  left++;
  const chunks = [];
  const s = net.connect({ host, port: Number(port), localAddress: src });
  const t = setTimeout(() => { console.log(JSON.stringify({ src, ok: false, error: 'timeout' })); s.destroy(); if (--left === 0) process.exit(0); }, Number(timeout));
  s.on('connect', () => s.write(req + '\\n'));
  s.on('data', (d) => chunks.push(d));
  s.on('error', (e) => { clearTimeout(t); console.log(JSON.stringify({ src, ok: false, error: e.code })); if (--left === 0) process.exit(0); });
  s.on('end', () => {
    clearTimeout(t);
    const all = Buffer.concat(chunks);
    const line = all.toString().split('\\n').filter(Boolean).pop() || '';
    const [who, peer] = line.replace(/^x+/, '').split(' ');
    console.log(JSON.stringify({ src, ok: true, who, peer, bytes: all.length }));
    if (--left === 0) process.exit(0);
  });
}
`;

export interface LbAnswer { src: string; ok: boolean; who?: string; peer?: string; bytes?: number; error?: string }

/** Connects from each of srcs in namespace ns (under /run/netns) to host:port; one answer per source. */
export function lbConnect(ns: string, host: string, port: number, srcs: string[], opts: { req?: string; timeoutMs?: number } = {}): LbAnswer[] {
  const out = execFileSync('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', CLIENT_JS, host, String(port), srcs.join(','), opts.req ?? 'hi', String(opts.timeoutMs ?? 5000)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return out.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as LbAnswer);
}
