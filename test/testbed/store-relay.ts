// One node's own path to the run's Redis: a Unix socket the test process forwards to Redis's socket, byte
// for byte. cut() makes the node's store path behave as a network partition does: every open connection
// stops moving in both directions (bytes stay queued, as TCP would hold them, and flow again on heal) and a
// new connection is accepted but not connected on until heal(). The other nodes' relays are untouched, so
// one node is cut off while the others still reach the store. Redis going away (kill, restart) closes the
// relayed connections as it closes direct ones.
import * as fs from 'node:fs';
import * as net from 'node:net';

interface Pair {
  down: net.Socket;
  up?: net.Socket;
  /** Bytes that arrived while cut, per direction, delivered on heal. */
  toUp: Buffer[];
  toDown: Buffer[];
}

export class StoreRelay {
  private readonly server: net.Server;
  private readonly pairs = new Set<Pair>();
  /** Connections accepted while cut, waiting for heal() to be connected upstream. */
  private held: Pair[] = [];
  private isCut = false;
  cutAt?: number;

  private constructor(
    readonly path: string,
    private readonly target: string,
  ) {
    this.server = net.createServer((down) => this.accept(down));
  }

  /** Listens on `path` (replacing a stale socket) and forwards to the Unix socket `target`. */
  static async start(path: string, target: string): Promise<StoreRelay> {
    fs.rmSync(path, { force: true });
    const r = new StoreRelay(path, target);
    await new Promise<void>((resolve, reject) => {
      r.server.once('error', reject);
      r.server.listen(path, () => resolve());
    });
    fs.chmodSync(path, 0o700);
    return r;
  }

  get cut(): boolean {
    return this.isCut;
  }

  /** Open relayed connections (for a test's diagnostics). */
  get connections(): number {
    return this.pairs.size;
  }

  /** Stops every byte in both directions and holds new connections (a partition of this node only). */
  partition(): void {
    if (this.isCut) return;
    this.isCut = true;
    this.cutAt = Date.now();
  }

  /** Lets queued bytes flow again and connects the connections held during the cut. */
  heal(): void {
    if (!this.isCut) return;
    this.isCut = false;
    this.cutAt = undefined;
    for (const p of this.pairs) {
      if (!p.up) continue;
      for (const b of p.toUp.splice(0)) p.up.write(b);
      for (const b of p.toDown.splice(0)) p.down.write(b);
    }
    const held = this.held;
    this.held = [];
    for (const p of held) if (!p.down.destroyed) this.connect(p);
  }

  async close(): Promise<void> {
    for (const p of this.pairs) {
      p.down.destroy();
      p.up?.destroy();
    }
    this.pairs.clear();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    fs.rmSync(this.path, { force: true });
  }

  private accept(down: net.Socket): void {
    const p: Pair = { down, toUp: [], toDown: [] };
    this.pairs.add(p);
    down.on('error', () => undefined);
    down.on('close', () => {
      p.up?.destroy();
      this.pairs.delete(p);
    });
    down.on('data', (b: Buffer) => {
      if (this.isCut || !p.up) p.toUp.push(b);
      else p.up.write(b);
    });
    if (this.isCut) {
      this.held.push(p);
      return;
    }
    this.connect(p);
  }

  private connect(p: Pair): void {
    const up = net.connect(this.target);
    p.up = up;
    up.on('error', () => p.down.destroy());
    up.on('close', () => p.down.destroy());
    up.on('data', (b: Buffer) => {
      if (this.isCut) p.toDown.push(b);
      else p.down.write(b);
    });
    // What the client sent before the upstream existed goes first (net queues writes until connected).
    for (const b of p.toUp.splice(0)) up.write(b);
  }
}
