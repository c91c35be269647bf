// PodStore file names: fixed length whatever the runtime passes (a 255-character container ID, odd
// characters), and records written under the earlier naming (URI-encoded fields) load, move to their
// fixed-length name and can be removed for good.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileName, PodStore, type PodRecord } from '../../daemon/state/pod-store';

const rec = (containerId: string, network = 'net'): PodRecord => ({ network, containerId, ifName: 'eth0', netns: '/run/netns/x', phase: 'attached', config: {}, createdAt: new Date(0).toISOString() });

function withDir(fn: (dir: string) => void): void {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-podstore-'));
  try {
    fn(dir);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test('file names are 64 hex digits whatever the key', () => {
  withDir((dir) => {
    const s = new PodStore(dir);
    s.put(rec('c'.repeat(255), 'n'.repeat(255)));
    s.put(rec('a.b_c-d'));
    const names = fs.readdirSync(path.join(dir, 'pods')).sort();
    assert.is(names.length, 2);
    for (const n of names) assert.match(n, /^[0-9a-f]{64}\.json$/);
    const again = new PodStore(dir);
    assert.equal(again.load(), { loaded: 2, broken: [] });
    assert.ok(again.get({ network: 'n'.repeat(255), containerId: 'c'.repeat(255), ifName: 'eth0' }));
  });
});

test('a record under the earlier name loads, moves to its fixed-length name, and is removed for good', () => {
  withDir((dir) => {
    fs.mkdirSync(path.join(dir, 'pods'), { recursive: true });
    const old = rec('old-ctr', 'tether-net');
    const oldName = `${encodeURIComponent(old.network)}__${encodeURIComponent(old.containerId)}__${encodeURIComponent(old.ifName)}.json`;
    fs.writeFileSync(path.join(dir, 'pods', oldName), JSON.stringify(old));
    const s = new PodStore(dir);
    assert.equal(s.load(), { loaded: 1, broken: [] });
    assert.equal(fs.readdirSync(path.join(dir, 'pods')), [fileName(old)]);
    s.remove(old);
    assert.equal(fs.readdirSync(path.join(dir, 'pods')), []);
    const after = new PodStore(dir);
    assert.equal(after.load(), { loaded: 0, broken: [] });
  });
});

test('a broken record is set aside, not loaded and not lost', () => {
  withDir((dir) => {
    fs.mkdirSync(path.join(dir, 'pods'), { recursive: true });
    fs.writeFileSync(path.join(dir, 'pods', 'x.json'), '{not json');
    const s = new PodStore(dir);
    assert.equal(s.load(), { loaded: 0, broken: ['x.json'] });
    assert.equal(fs.readdirSync(path.join(dir, 'pods')), ['x.json.broken']);
  });
});

test.run();
