// The installer against libcni itself: for every directory below (the fixtures, and the cases where a
// runtime and a JSON.parse-based installer disagree), in containerd's mode and CRI-O's, the Go program in
// test/golden-libcni says what libcni loads, and the installer's model must say the same — file, name,
// version, plugins, and the error word for word. Then `install` runs: where the runtime loads a primary
// tether can chain into, libcni must load the written file with the same name and tether last, readiness
// must say ready, and uninstall must give the directory back byte for byte; where it cannot, nothing is
// written and readiness names the file and libcni's reason.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { makeLogger } from '../../lib/log';
import { Installer, readConfDir, readiness } from '../../install/cni/installer';
import { runtimeLoad, type Runtime } from '../../install/cni/libcni';
import { buildLoader, findGo, libcniLoad, type LibcniAnswer } from '../golden-libcni/libcni-load';

const FIXTURES = path.resolve(__dirname, '../fixtures/cni-install');
const quiet = makeLogger({ level: 'error' });
const BRIDGE = '{"cniVersion":"0.3.1","name":"podnet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}}';
const PTP_LIST = '{"cniVersion":"1.0.0","name":"ptpnet","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.89.0.0/16"}},{"type":"portmap","capabilities":{"portMappings":true}}]}';

/** Name → file text. Each case names what makes it interesting. */
const CASES: Record<string, Record<string, string>> = {
  'no-type .conf before a list': { '05-no-type.conf': '{"cniVersion":"1.0.0","name":"no-type"}', '10-ptp.conflist': PTP_LIST },
  'empty .conflist before a .conf': { '06-empty.conflist': '{"cniVersion":"1.0.0","name":"empty","plugins":[]}', '10-bridge.conf': BRIDGE },
  '"Type" capitalised in a .conf': { '10-bridge.conf': '{"cniVersion":"0.3.1","name":"podnet","Type":"bridge"}' },
  '"TYPE" in a list\'s plugin': { '10-ptp.conflist': '{"cniVersion":"1.0.0","name":"ptpnet","plugins":[{"TYPE":"ptp"}]}' },
  'type and Type both: the last wins in a .conf, sorted keys in a list': {
    '10-a.conf': '{"cniVersion":"0.3.1","name":"a","type":"","Type":"bridge"}',
    '20-b.conflist': '{"cniVersion":"0.3.1","name":"b","plugins":[{"type":"ptp","Type":""}]}',
  },
  '"name": "" in a list': { '10-ptp.conflist': '{"cniVersion":"1.0.0","name":"","plugins":[{"type":"ptp"}]}' },
  '"Name" in a list (libcni reads the list as a map: no name)': { '10-ptp.conflist': '{"cniVersion":"1.0.0","Name":"ptpnet","plugins":[{"type":"ptp"}]}', '20-bridge.conf': BRIDGE },
  'numeric cniVersion in a list': { '10-ptp.conflist': '{"cniVersion":0.3,"name":"ptpnet","plugins":[{"type":"ptp"}]}', '20-bridge.conf': BRIDGE },
  'numeric cniVersion in a .conf': { '10-bridge.conf': '{"cniVersion":1.0,"name":"podnet","type":"bridge"}', '20-ptp.conflist': PTP_LIST },
  'string disableCheck': { '10-ptp.conflist': '{"cniVersion":"1.0.0","name":"ptpnet","disableCheck":"true","plugins":[{"type":"ptp"}]}', '20-bridge.conf': BRIDGE },
  '.conf without cniVersion': { '10-bridge.conf': '{"name":"podnet","type":"bridge"}' },
  '.conf at 0.2.0': { '10-bridge.conf': '{"cniVersion":"0.2.0","name":"podnet","type":"bridge"}' },
  'list at 0.3.0': { '10-ptp.conflist': '{"cniVersion":"0.3.0","name":"ptpnet","plugins":[{"type":"ptp"}]}' },
  'big integers and number spellings kept': {
    '10-ptp.conflist': '{\n\t"name": "ptpnet",  "cniVersion": "1.0.0",\n\t"plugins": [\n\t\t{"type": "ptp", "mtu": 123456789012345678, "f": 1.50E+2, "z": -0.0}\n\t],\n\t"zzz": 1\n}\n',
  },
  'a number beyond float64 in a .conf': { '10-bridge.conf': '{"cniVersion":"0.3.1","name":"podnet","type":"bridge","huge":1e400}', '20-ptp.conflist': PTP_LIST },
  'syntax errors as Go words them': {
    '01-eof.conflist': '{"name": "x", "plugins": [',
    '02-quote.conf': "{'type': 'bridge'}",
    '03-trailing.conf': '{"type":"bridge"} x',
    '04-array.conflist': '[1, 2]',
    '05-null.conf': 'null',
    '06-literal.conf': '{"type": tru}',
    '07-bom.conf': '\ufeff{"type":"bridge"}',
    '08-ctl.conf': '{"type":"a\nb"}',
    '09-number.conf': '{"type":"b","x":01}',
    '10-escape.conf': '{"type":"\\x"}',
    '50-bridge.conf': BRIDGE,
  },
  'type errors as Go words them': {
    '01-ipam.conf': '{"type":"bridge","ipam":"host-local"}',
    '02-ipamtype.conf': '{"type":"bridge","ipam":{"type":7}}',
    '03-dns.conf': '{"type":"bridge","dns":{"nameservers":["10.0.0.1",5]}}',
    '04-caps.conf': '{"type":"bridge","capabilities":{"portMappings":"yes"}}',
    '05-plugin-string.conflist': '{"name":"x","plugins":["ptp"]}',
    '06-name-number.conflist': '{"name":5,"plugins":[{"type":"ptp"}]}',
    '07-plugins-object.conflist': '{"name":"x","plugins":{"type":"ptp"}}',
    '08-prev.conf': '{"type":"bridge","prevResult":[]}',
    '09-null-type.conf': '{"type":"bridge","type":null}',
    '50-bridge.json': BRIDGE,
  },
  'a .json primary and a list of tether alone': {
    '05-only.conflist': '{"cniVersion":"1.0.0","name":"t","plugins":[{"type":"tether"}]}',
    '10-bridge.json': BRIDGE,
  },
};

let loader: { bin: string; dir: string } | undefined;
const go = findGo();

test.before(() => {
  if (go) loader = buildLoader(go);
});

test.after(() => {
  if (loader) fs.rmSync(loader.dir, { recursive: true, force: true });
});

function makeDir(files: Record<string, string | Buffer>) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-libcni-golden-'));
  const netDir = path.join(root, 'net.d');
  const binDir = path.join(root, 'bin');
  const srcBinDir = path.join(root, 'src');
  for (const d of [netDir, binDir, srcBinDir]) fs.mkdirSync(d);
  fs.writeFileSync(path.join(srcBinDir, 'tether'), '#!/bin/sh\n', { mode: 0o755 });
  fs.symlinkSync('tether', path.join(srcBinDir, 'tether-ipam'));
  for (const [n, s] of Object.entries(files)) fs.writeFileSync(path.join(netDir, n), s);
  return { root, netDir, binDir, srcBinDir, stateDir: path.join(root, 'state'), log: quiet };
}

function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of fs.readdirSync(dir).sort()) out[f] = fs.readFileSync(path.join(dir, f)).toString('base64');
  return out;
}

/** The installer's model in the Go program's shape. */
function modelAnswer(netDir: string, runtime: Runtime): LibcniAnswer {
  const r = runtimeLoad(readConfDir(netDir), runtime);
  const skipped = r.skipped.map((s) => ({ file: s.file, error: s.why }));
  if (r.failed) return { ok: false, file: r.failed.file, name: '', cniVersion: '', plugins: [], error: r.failed.error, skipped };
  if (!r.loaded) return { ok: false, name: '', cniVersion: '', plugins: [], error: `no valid networks found in ${netDir}`, skipped };
  return { ok: true, file: r.loaded.file, name: r.loaded.name, cniVersion: r.loaded.cniVersion, plugins: r.loaded.plugins.map((p) => p.type), skipped };
}

const fixtureCases = fs.readdirSync(FIXTURES).sort().map((c): [string, Record<string, Buffer>] => {
  const dir = path.join(FIXTURES, c, 'in');
  return [`fixture ${c}`, Object.fromEntries(fs.readdirSync(dir).map((f) => [f, fs.readFileSync(path.join(dir, f))]))];
});

for (const [label, files] of [...fixtureCases, ...Object.entries(CASES)]) {
  for (const runtime of ['containerd', 'crio'] as const) {
    test(`${runtime}: ${label}`, () => {
      if (!loader) {
        console.log(`  skipped: no Go toolchain (looked for ${['/usr/lib/go-1.19/bin/go', '/usr/lib/go/bin/go', '/usr/bin/go'].join(', ')}); install/deps.sh installs golang-1.19-go`);
        return;
      }
      const d = makeDir(files);
      try {
        const before = snapshot(d.netDir);
        const truth = libcniLoad(loader.bin, runtime, d.netDir);
        assert.equal(modelAnswer(d.netDir, runtime), truth, 'the installer loads the directory as libcni does');

        const ready0 = readiness(d.netDir, d.binDir, runtime);
        assert.not.ok(ready0.ready, 'nothing chains tether yet');
        if (!truth.ok && truth.file) assert.ok(ready0.why.includes(truth.error!), `readiness names libcni's reason: ${ready0.why}`);

        if (truth.ok && truth.plugins.every((p) => p === 'tether')) {
          // A list of tether alone is what the runtime runs: no pod gets an address, so never ready.
          assert.match(ready0.why, /holds tether, but not as the last plugin after a primary/);
          return;
        }
        const out = new Installer({ ...d, runtime }).reconcile();
        const speaks = ['0.3.1', '0.4.0', '1.0.0', '1.1.0'];
        if (!truth.ok) {
          if (out.state === 'installed') assert.unreachable(`installed although ${runtime} loads ${truth.file ?? 'nothing'}: ${truth.error}`);
          if (truth.file) assert.ok(out.state === 'waiting' && out.why.includes(truth.error!), `the installer names libcni's reason: ${JSON.stringify(out)}`);
          assert.equal(snapshot(d.netDir), before, 'nothing written');
          return;
        }
        if (!speaks.includes(truth.cniVersion)) {
          assert.is(out.state, 'waiting');
          assert.ok(out.state === 'waiting' && out.refused, 'refused');
          assert.ok(out.state === 'waiting' && out.why.includes(truth.file!), `the refusal names the file: ${out.state === 'waiting' && out.why}`);
          assert.equal(snapshot(d.netDir), before, 'nothing written');
          const r = readiness(d.netDir, d.binDir, runtime);
          assert.not.ok(r.ready);
          assert.ok(r.why.includes(truth.file!) && r.why.includes('cniVersion'), r.why);
          return;
        }
        assert.is(out.state, 'installed', JSON.stringify(out));
        const after = libcniLoad(loader.bin, runtime, d.netDir);
        assert.ok(after.ok, `libcni loads the chained file: ${after.error}`);
        assert.is(after.name, truth.name, 'same network name');
        assert.equal(after.plugins, [...truth.plugins.filter((p) => p !== 'tether'), 'tether'], 'tether last, after the primary\'s plugins');
        assert.equal(modelAnswer(d.netDir, runtime), after, 'the model agrees after install too');
        const ready = readiness(d.netDir, d.binDir, runtime);
        assert.ok(ready.ready, ready.why);
        assert.ok(ready.why.startsWith(after.file!), ready.why);

        new Installer({ ...d, runtime, srcBinDir: undefined }).uninstall();
        if (label !== 'fixture flannel-upgrade') assert.equal(snapshot(d.netDir), before, 'uninstall restores the directory byte for byte');
      } finally {
        fs.rmSync(d.root, { recursive: true, force: true });
      }
    });
  }
}

test('a list primary keeps every byte but the appended entry (numbers, tabs, key order)', () => {
  const d = makeDir(CASES['big integers and number spellings kept']);
  try {
    const before = fs.readFileSync(path.join(d.netDir, '10-ptp.conflist'), 'utf8');
    new Installer({ ...d, runtime: 'containerd' }).reconcile();
    const after = fs.readFileSync(path.join(d.netDir, '10-ptp.conflist'), 'utf8');
    assert.ok(after.includes('"mtu": 123456789012345678, "f": 1.50E+2, "z": -0.0}'), after);
    const entry = ',\n\t\t{\n\t\t  "type": "tether",\n\t\t  "socketPath": "/run/tether/tetherd.sock"\n\t\t}';
    const at = before.indexOf('}\n\t]');
    assert.is(after, before.slice(0, at + 1) + entry + before.slice(at + 1), 'only our entry was added, in the file\'s own indentation');
  } finally {
    fs.rmSync(d.root, { recursive: true, force: true });
  }
});

test.run();
