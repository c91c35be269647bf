// The file config source: multi-document YAML, JSON, List kinds, kinds passed on untouched, errors that
// name file and document, and the legacy node-facts JSON through loadNodeConfig.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig, parseConfig } from '../../daemon/config/objects';
import { loadNodeConfig } from '../../daemon/config/node-config';
import { TetherError } from '../../lib/errors';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-config-'));
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

function write(name: string, text: string): string {
  const file = path.join(dir, name);
  fs.writeFileSync(file, text);
  return file;
}

function configError(fn: () => unknown): TetherError {
  try {
    fn();
  } catch (e) {
    assert.instance(e, TetherError);
    assert.is((e as TetherError).code, 'INVALID_CONFIG');
    return e as TetherError;
  }
  assert.unreachable('expected an InvalidConfig error');
  throw new Error('unreachable');
}

const POOL = (name: string, cidr: string, usage = 'pod') =>
  `apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata:\n  name: ${name}\nspec:\n  usage: ${usage}\n  ipv4:\n    cidr: ${cidr}\n`;

test('the example conf/pools.yaml loads: three pools, two zoned nodes', () => {
  const c = loadConfig(path.join(__dirname, '../../conf/pools.yaml'));
  assert.equal(c.pools.map((p) => [p.name, p.usage, p.families.map((f) => `${f.cidr}@${f.blockSize}`)]), [
    ['default', 'pod', ['10.244.0.0/16@26', 'fd00:10:244::/56@122']],
    ['floating', 'floating', ['10.250.0.0/24@24', 'fd00:10:250::/120@120']],
    ['public', 'loadBalancer', ['192.0.2.0/24@24']],
  ]);
  assert.equal(Object.keys(c.nodes).sort(), ['node-1', 'node-2']);
  assert.is(c.nodes['node-1'].zone, 'zone-a');
  assert.is(c.nodes['node-2'].zone, 'zone-b');
  assert.equal(c.others, []);
});

test('multi-document YAML with a List, kinds passed on as written, empty documents skipped', () => {
  const egress = {
    apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', metadata: { name: 'out', namespace: 'shop' },
    spec: { clients: { podSelector: { matchLabels: { app: 'web' } } }, gateways: { podSelector: { matchLabels: { role: 'gw' } } }, addresses: { pool: 'f' } },
  };
  const text = [
    POOL('a', '10.1.0.0/16'),
    `kind: List\napiVersion: v1\nitems:\n  - ${JSON.stringify(egress)}\n  - apiVersion: tether.dev/v1alpha1\n    kind: Node\n    metadata: { name: n1.example, labels: { topology.kubernetes.io/zone: z1, rack: r7 } }\n`,
    'apiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: shop }\nspec: { type: LoadBalancer, loadBalancerClass: tether.dev/lb, ports: [{ port: 80 }] }\n',
    '',
  ].join('---\n');
  const c = parseConfig(text, 'mixed.yaml');
  assert.equal(c.pools.map((p) => p.name), ['a']);
  assert.equal(c.nodes, { 'n1.example': { zone: 'z1', labels: { 'topology.kubernetes.io/zone': 'z1', rack: 'r7' } } });
  assert.equal(c.others.map((o) => o.kind), ['Egress', 'Service']);
  assert.equal(c.others[0], egress);
});

test('JSON files: one object, a List, or an array of objects', () => {
  const pool = { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'j' }, spec: { usage: 'floating', ipv6: { cidr: 'fd00::/120' } } };
  const node = { apiVersion: 'tether.dev/v1alpha1', kind: 'Node', metadata: { name: 'n2' }, spec: { zone: 'z2' } };
  const one = loadConfig(write('one.json', JSON.stringify(pool)));
  assert.equal(one.pools.map((p) => [p.name, p.families[0].cidr, p.families[0].blockSize]), [['j', 'fd00::/120', 120]]);
  const list = loadConfig(write('list.json', JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [pool, node] }, null, 2)));
  assert.equal([list.pools.length, list.nodes], [1, { n2: { zone: 'z2', labels: {} } }]);
  const arr = loadConfig(write('arr.json', JSON.stringify([pool, node])));
  assert.equal([arr.pools.length, Object.keys(arr.nodes)], [1, ['n2']]);
});

test('errors name the file and the document (and the list item), all collected', () => {
  const text = [
    POOL('good', '10.1.0.0/16'),
    'apiVersion: tether.dev/v1alpha1\nkind: AdressPool\nmetadata: { name: typo }\n',
    POOL('blue', '10.2.3.4/16'),
    'kind: List\nitems:\n  - 7\n  - ' + JSON.stringify({ apiVersion: 'tether.dev/v1alpha1', kind: 'Node', metadata: { name: 'n' }, spec: { zon: 'a' } }) + '\n',
    POOL('good', '10.1.128.0/17', 'floating'),
  ].join('---\n');
  const e = configError(() => parseConfig(text, '/etc/tether/pools.yaml'));
  assert.equal(e.message.split('\n'), [
    '/etc/tether/pools.yaml document 2: kind "AdressPool" is not one of AddressPool, Node, Pod, Egress, Service, EndpointSlice, List',
    '/etc/tether/pools.yaml document 4 items[0]: must be an object, not 7',
    '/etc/tether/pools.yaml document 4 items[1]: Node "n": unknown field spec.zon',
    '/etc/tether/pools.yaml document 3: AddressPool "blue": spec.ipv4.cidr "10.2.3.4/16" is not a network address (did you mean 10.2.0.0/16?)',
    '/etc/tether/pools.yaml document 5: AddressPool "good": metadata.name is already used by /etc/tether/pools.yaml document 1',
  ]);
});

test('overlap across documents names both documents, pools and CIDRs', () => {
  const e = configError(() => parseConfig([POOL('a', '10.0.0.0/16'), POOL('b', '10.0.7.0/24', 'loadBalancer')].join('---\n'), 'p.yaml'));
  assert.is(e.message, 'p.yaml document 2: AddressPool "b": spec.ipv4.cidr 10.0.7.0/24 overlaps p.yaml document 1: AddressPool "a" spec.ipv4.cidr 10.0.0.0/16');
});

test('YAML syntax errors and duplicate keys name the document', () => {
  const e = configError(() => parseConfig(`${POOL('a', '10.0.0.0/16')}---\nkind: [Node\n`, 'bad.yaml'));
  assert.match(e.message, /^bad\.yaml document 2: /);
  assert.not.match(e.message, /document 1/);
  const d = configError(() => parseConfig('kind: Node\nkind: Node\n', 'dup.yaml'));
  assert.match(d.message, /^dup\.yaml document 1: .*[Dd]uplicate|^dup\.yaml document 1: .*unique/);
});

test('Node objects: zone from spec or label, contradictions, duplicates, bad names', () => {
  const node = (name: string, extra = '') => `apiVersion: tether.dev/v1alpha1\nkind: Node\nmetadata:\n  name: ${name}\n${extra}`;
  const e = configError(() => parseConfig([
    node('n1', 'spec: { zone: a }\n'),
    node('n1', 'spec: { zone: b }\n'),
    node('n3', '  labels: { topology.kubernetes.io/zone: b }\nspec: { zone: a }\n'),
    node('N_4'),
    'apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: x }\nspec: { usage: pod, ipv4: { cidr: 10.0.0.0/16 } }\nextra: 1\n',
  ].join('---\n'), 'nodes.yaml'));
  assert.equal(e.message.split('\n'), [
    'nodes.yaml document 2: Node "n1" is already defined in nodes.yaml document 1',
    'nodes.yaml document 3: Node "n3": spec.zone "a" contradicts metadata.labels.topology.kubernetes.io/zone "b"',
    'nodes.yaml document 4: Node "N_4": metadata.name "N_4" must be a DNS-1123 subdomain',
    'nodes.yaml document 5: AddressPool "x": unknown field extra',
  ]);
});

test('a document with neither kind nor the legacy form is rejected', () => {
  const e = configError(() => parseConfig('metadata: { name: x }\nspec: { usage: pod }\n', 'k.yaml'));
  assert.is(e.message, 'k.yaml document 1: kind is missing (one of AddressPool, Node, Pod, Egress, Service, EndpointSlice, List)');
});

test('loadNodeConfig: legacy JSON still works; Node objects work; absent file or node means no facts', () => {
  const legacy = write('legacy.json', JSON.stringify({ nodes: { w1: { zone: 'z1', labels: { rack: 'r1' } }, w2: {} }, comment: 'ignored' }));
  assert.equal(loadNodeConfig(legacy, 'w1'), { zone: 'z1', labels: { rack: 'r1' } });
  assert.equal(loadNodeConfig(legacy, 'w2'), { labels: {} });
  assert.equal(loadNodeConfig(legacy, 'nobody'), { labels: {} });
  assert.equal(loadNodeConfig(undefined, 'w1'), { labels: {} });
  assert.equal(loadNodeConfig(write('empty.json', '{}'), 'w1'), { labels: {} });
  const yaml = write('nodes.yaml', 'apiVersion: tether.dev/v1alpha1\nkind: Node\nmetadata: { name: w1, labels: { rack: r2 } }\nspec: { zone: z9 }\n');
  assert.equal(loadNodeConfig(yaml, 'w1'), { zone: 'z9', labels: { rack: 'r2' } });
});

test('loadNodeConfig rejects a broken legacy file, a broken pool, and a missing file', () => {
  const badZone = write('badzone.json', JSON.stringify({ nodes: { w1: { zone: 5 } } }));
  assert.match(configError(() => loadNodeConfig(badZone, 'w1')).message, /badzone\.json document 1: nodes\.w1\.zone must be a string$/);
  const badLabels = write('badlabels.json', JSON.stringify({ nodes: { w1: { labels: { a: 1 } } } }));
  assert.match(configError(() => loadNodeConfig(badLabels, 'w1')).message, /nodes\.w1\.labels must map strings to strings$/);
  const badPool = write('badpool.yaml', POOL('p', '10.0.0.1/16'));
  assert.match(configError(() => loadNodeConfig(badPool, 'w1')).message, /badpool\.yaml document 1: AddressPool "p": spec\.ipv4\.cidr/);
  assert.match(configError(() => loadNodeConfig(path.join(dir, 'absent.yaml'), 'w1')).message, /^config .*absent\.yaml: ENOENT/);
});

test.run();
