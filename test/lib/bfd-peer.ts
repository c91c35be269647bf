// Child process for test/kernel/bfd.test.ts, started inside a namespace with nsenter: runs one BfdEndpoint
// and session (or, without a peer, only sends raw datagrams like an attacker would). JSON lines both ways:
// events on stdout, commands on stdin (stats, captured, send).
import * as dgram from 'node:dgram';
import * as readline from 'node:readline';
import { BfdEndpoint, BfdState, BfdDiag, type BfdDatagramEvent, type BfdStateChange } from '../../daemon/bfd';
import { BfdThread } from '../../daemon/bfd/threaded';

interface Config {
  address: string;
  peer?: string;
  port?: number;
  keyHex?: string;
  keyId?: number;
  /** Run the endpoint on tetherd's BFD thread instead of this process's main event loop. */
  threaded?: boolean;
  /** Session timers (µs) and multiplier; the session's defaults otherwise. */
  timers?: { desiredMinTxUs: number; requiredMinRxUs: number; detectMult: number };
}

const cfg: Config = JSON.parse(process.argv[2]);
const out = (o: object) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() }) + '\n');

async function main(): Promise<void> {
  let endpoint: BfdEndpoint | undefined;
  // Accepted packets from the peer, kept for replay: the first few (Down/Init) and the most recent ones.
  const first: BfdDatagramEvent[] = [];
  const recent: BfdDatagramEvent[] = [];
  let thread: BfdThread | undefined;
  const auth = cfg.keyHex ? { auth: { keyId: cfg.keyId ?? 1, key: Buffer.from(cfg.keyHex, 'hex') } } : {};
  if (cfg.peer && cfg.threaded) {
    thread = await BfdThread.open({ address: cfg.address, port: cfg.port });
    const s = thread.session(cfg.peer, { ...cfg.timers, ...auth });
    s.on('state', (c: BfdStateChange) => out({ ev: 'state', from: BfdState[c.from], to: BfdState[c.to], diag: BfdDiag[c.diag], sinceLastRxMs: c.sinceLastRxMs }));
  } else if (cfg.peer) {
    endpoint = await BfdEndpoint.open({ address: cfg.address, port: cfg.port });
    endpoint.on('datagram', (ev: BfdDatagramEvent) => {
      if (ev.verdict !== 'accepted') return;
      if (first.length < 10) first.push(ev);
      else recent.push(ev), recent.length > 30 && recent.shift();
    });
    const s = endpoint.session(cfg.peer, { ...cfg.timers, ...auth });
    s.on('state', (c: BfdStateChange) => out({ ev: 'state', from: BfdState[c.from], to: BfdState[c.to], diag: BfdDiag[c.diag], sinceLastRxMs: c.sinceLastRxMs }));
  }
  const raw = dgram.createSocket('udp4');
  await new Promise<void>((r) => raw.bind(0, cfg.address, () => r()));
  out({ ev: 'ready', pid: process.pid });

  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    const c = JSON.parse(line);
    if (c.cmd === 'stats') out({ ev: 'stats', stats: endpoint?.stats() ?? thread?.stats() });
    if (c.cmd === 'block') {
      // Keeps this process's main thread busy, as a CNI ADD storm or a large resync does in tetherd.
      const end = Date.now() + c.ms;
      while (Date.now() < end) Math.sqrt(Math.random());
      out({ ev: 'blocked', ms: c.ms });
    }
    if (c.cmd === 'captured') out({ ev: 'captured', packets: [...first, ...recent].map((e) => ({ hex: e.data.toString('hex'), state: BfdState[e.packet!.state] })) });
    if (c.cmd === 'send') {
      // Every `everyMs`, send each packet once to `to`:`port`, for `forMs`; then report how many went out.
      const bufs = (c.packets as string[]).map((h) => Buffer.from(h, 'hex'));
      let n = 0;
      const end = Date.now() + c.forMs;
      const tick = () => {
        for (const b of bufs) raw.send(b, c.port, c.to), n++;
        if (Date.now() < end) setTimeout(tick, c.everyMs);
        else out({ ev: 'sent', n });
      };
      tick();
    }
  });
  rl.on('close', () => process.exit(0));
}

main().catch((e) => {
  process.stderr.write(`bfd-peer: ${e?.stack ?? e}\n`);
  process.exit(1);
});
