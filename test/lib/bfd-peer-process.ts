// Drives one test/lib/bfd-peer.ts child process inside a network namespace (nsenter): JSON lines both ways.
import { spawn, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import * as readline from 'node:readline';

const root = path.resolve(__dirname, '../..');

/** One child process speaking the JSON-lines protocol of test/lib/bfd-peer.ts. */
export class BfdPeerProcess {
  readonly proc: ChildProcess;
  readonly events: any[] = [];
  readonly stderr: string[] = [];
  private waiters: Array<() => void> = [];

  constructor(ns: string, cfg: object) {
    this.proc = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-r', 'tsx/cjs', 'test/lib/bfd-peer.ts', JSON.stringify(cfg)], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] });
    readline.createInterface({ input: this.proc.stdout! }).on('line', (l) => {
      this.events.push(JSON.parse(l));
      for (const w of this.waiters.splice(0)) w();
    });
    readline.createInterface({ input: this.proc.stderr! }).on('line', (l) => this.stderr.push(l));
  }

  /** Resolves with the first event at index ≥ `from` that matches. */
  async wait(pred: (e: any) => boolean, ms: number, what: string, from = 0): Promise<any> {
    const end = Date.now() + ms;
    for (;;) {
      const hit = this.events.slice(from).find(pred);
      if (hit) return hit;
      const left = end - Date.now();
      if (left <= 0) throw new Error(`timed out after ${ms} ms waiting for ${what}; stderr: ${this.stderr.slice(-5).join(' | ')}`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.waiters.push(() => (clearTimeout(t), r()));
      });
    }
  }

  async ask(cmd: object, reply: string): Promise<any> {
    const from = this.events.length;
    this.proc.stdin!.write(JSON.stringify(cmd) + '\n');
    return this.wait((e) => e.ev === reply, 5000, reply, from);
  }

  kill(): void {
    if (this.proc.exitCode === null) this.proc.kill('SIGKILL');
  }
}

