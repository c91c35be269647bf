// Benchmark (not a test): time from an object change to the datapath updated, for both config sources.
// The change: a client pod's label toggled (it stops, then starts again, being a client of an Egress), by a
// file edit (file source: the shared config file replaced atomically) and by an API event (the FAKE API
// server in the testbed: a Pod object updated). The datapath is updated when tetherd has written the pod's
// entry in the steering map: it logs "egress: client pod steered" / "no longer steered" right after that
// synchronous map write, so latency = that log line's timestamp − the moment before the change (one clock).
// Writes results/bench-config.json and the README section.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { topology, waitOwner } from '../testbed/egress-scenario';
import { machine, percentile, updateReadme } from './stats';

const TOGGLES = Number(process.env.BENCH_TOGGLES ?? 40);
const repo = path.resolve(__dirname, '../..');

function actions(tb: Testbed): Array<{ t: number; msg: string }> {
  return fs.readFileSync(tb.tetherdLog('n3'), 'utf8').split('\n').flatMap((l) => {
    if (!l.startsWith('{') || !l.includes('"pod":"shop/web"')) return [];
    const j = JSON.parse(l) as { message: string; timestamp: string };
    return j.message === 'egress: client pod steered' || j.message === 'egress: client pod no longer steered' ? [{ t: Date.parse(j.timestamp), msg: j.message }] : [];
  });
}

async function measure(tb: Testbed, change: (steered: boolean) => void): Promise<number[]> {
  await waitOwner(tb);
  const out: number[] = [];
  for (let i = 0; i < TOGGLES; i++) {
    const steered = i % 2 === 1; // first: label removed, then restored, and so on
    const before = actions(tb).length;
    const t0 = Date.now();
    change(steered);
    const end = Date.now() + 10_000;
    for (;;) {
      const a = actions(tb);
      if (a.length > before) {
        const want = steered ? 'egress: client pod steered' : 'egress: client pod no longer steered';
        const hit = a.slice(before).find((x) => x.msg === want);
        if (!hit) throw new Error(`unexpected action after toggle ${i}: ${a.slice(before).map((x) => x.msg).join(', ')}`);
        out.push(hit.t - t0);
        break;
      }
      if (Date.now() > end) throw new Error(`toggle ${i}: no datapath update within 10 s`);
      await new Promise((r) => setTimeout(r, 5));
    }
    await new Promise((r) => setTimeout(r, 300)); // let the file source's settle window pass between edits
  }
  return out;
}

const stats = (xs: number[]) => ({ n: xs.length, p50: percentile(xs, 50), p99: percentile(xs, 99), max: Math.max(...xs) });

async function main() {
  const base = topology();
  const pod = (labels: Record<string, string>) => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web', namespace: 'shop', labels } });
  const file = await withTestbed(base, (tb) =>
    measure(tb, (steered) => tb.rewriteConfig({ extraObjects: [...base.extraObjects!, pod({ app: steered ? 'web' : 'other' })] })));
  const api = await withTestbed({ ...base, configSource: 'kubernetes' }, (tb) =>
    measure(tb, (steered) => tb.api.apply(tb.podObject(tb.pod('n3-web'), { app: steered ? 'web' : 'other' }))));
  const result = { machine: machine(), toggles: TOGGLES, fileEditMs: stats(file), apiEventMs: stats(api), raw: { file, api } };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-config.json'), JSON.stringify(result, null, 2) + '\n');
  process.stdout.write(`object change → datapath: file edit p50 ${result.fileEditMs.p50} ms p99 ${result.fileEditMs.p99} ms; API event p50 ${result.apiEventMs.p50} ms p99 ${result.apiEventMs.p99} ms\n`);
  const m = result.machine as { cores?: number; cpu?: string; kernel?: string };
  updateReadme(path.join(repo, 'README.md'), 'config', `
| change | n | p50 (ms) | p99 (ms) | max (ms) |
|---|---|---|---|---|
| file edit (config file replaced) | ${file.length} | ${result.fileEditMs.p50} | ${result.fileEditMs.p99} | ${result.fileEditMs.max} |
| API event (Pod label updated) | ${api.length} | ${result.apiEventMs.p50} | ${result.apiEventMs.p99} | ${result.apiEventMs.max} |

From the change to tetherd's steering map updated for the pod (a label that makes a pod a client of an Egress, or stops it), on the testbed (${m.cores ?? "?"} cores${m.kernel ? `, kernel ${m.kernel}` : ''}). The file source waits ${100} ms for a file to settle before reading it (editors and config tools write in steps), which is most of its figure; the API source gathers the events of 50 ms into one update (a rollout changes many objects at once), which is most of its. Raw figures: \`results/bench-config.json\`.`);
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
