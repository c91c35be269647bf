// TLS to the cluster store, for real: install/ with the redis-tls component, built by `kubectl kustomize`,
// its Redis start script and readiness probe run with Debian's redis-server and a CA and certificate made
// here with openssl; tetherd's store clients connect with the store URL of the generated ConfigMap (only
// the host, port and file paths rewritten to this machine's). Checked: they connect and work over TLS, a
// server whose certificate another CA signed is refused by name, a plain connection gets nothing, and bad
// TLS URLs are refused at start naming what is wrong.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { RedisStore } from '../../ipam/store/redis-store';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { parseRedisUrl, withRedisPassword } from '../../daemon/common/redis';
import { ErrorCode, TetherError } from '../../lib/errors';
import { waitFor } from '../lib/wait';
import { freePort } from '../lib/ports';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');
const PASSWORD = 'pw-Zq3_x9fL0aTm7Yb2';
let tmp = '';
let proc: ChildProcess | undefined;

test.before(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-store-tls-'));
  fs.mkdirSync(path.join(tmp, 'auth'));
  fs.writeFileSync(path.join(tmp, 'auth/password'), PASSWORD, { mode: 0o400 });
  const ossl = (...args: string[]) => execFileSync('openssl', args, { cwd: tmp, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  // The CA that signs the server's certificate, and another one.
  for (const ca of ['ca', 'other-ca']) ossl('req', '-x509', ...ec, '-keyout', `${ca}.key`, '-out', `${ca}.crt`, '-days', '1', '-subj', `/CN=tether test ${ca}`);
  ossl('req', ...ec, '-keyout', 'tls.key', '-out', 'tls.csr', '-subj', '/CN=tether-redis');
  fs.writeFileSync(path.join(tmp, 'san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  ossl('x509', '-req', '-in', 'tls.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'tls.crt', '-days', '1', '-extfile', 'san.ext');
  // The Secret tether-redis-tls as the component mounts it at /tls.
  fs.mkdirSync(path.join(tmp, 'tls'));
  for (const [from, to] of [['tls.crt', 'tls.crt'], ['tls.key', 'tls.key'], ['ca.crt', 'ca.crt']]) fs.copyFileSync(path.join(tmp, from), path.join(tmp, 'tls', to));
});

test.after(async () => {
  if (proc && proc.exitCode === null && proc.signalCode === null) {
    proc.kill('SIGKILL');
    await new Promise((r) => proc!.once('exit', r));
  }
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

/** install/ with the redis-tls component, as a user's overlay would use it. */
function buildWithTls(): Obj[] {
  const overlay = path.join(tmp, 'overlay');
  fs.mkdirSync(overlay, { recursive: true });
  const install = path.relative(overlay, path.join(root, 'install'));
  fs.writeFileSync(path.join(overlay, 'kustomization.yaml'), `resources: [${install}]\ncomponents: [${install}/redis-tls]\n`);
  const out = execFileSync('kubectl', ['kustomize', overlay], { encoding: 'utf8' });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}


const localize = (script: string, dir: string) => script.replaceAll('/auth/', `${tmp}/auth/`).replaceAll('/conf/', `${dir}/`).replaceAll('/tls/', `${tmp}/tls/`);

test('install/ + redis-tls: Redis answers TLS only; tetherd\'s clients connect with the ConfigMap\'s rediss:// URL and the CA; another CA\'s server is refused; bad TLS URLs are refused naming why', async () => {
  const objs = buildWithTls();
  const scripts = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'tether-redis')!.data as Record<string, string>;
  const storeUrl = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('tether-store-'))!.data.url as string;
  assert.match(storeUrl, /^rediss:\/\/tether-redis\.tether-system\.svc:6379\?ca=\/var\/run\/tether\/redis-tls\/ca\.crt$/);
  // The DaemonSet mounts the CA where the URL says, and refers to this ConfigMap; the Redis pod mounts the Secret at /tls.
  const ds = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  const tetherd = ds.spec.template.spec.containers.find((c: Obj) => c.name === 'tetherd');
  assert.ok(tetherd.volumeMounts.some((m: Obj) => m.mountPath === '/var/run/tether/redis-tls'));
  assert.ok(ds.spec.template.spec.volumes.some((v: Obj) => v.secret?.secretName === 'tether-redis-tls'));
  assert.is(tetherd.env.find((e: Obj) => e.name === 'TETHER_REDIS_URL').valueFrom.configMapKeyRef.name, objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('tether-store-'))!.metadata.name);
  const redisPod = objs.find((o) => o.kind === 'Deployment' && o.metadata.name === 'tether-redis')!.spec.template.spec;
  assert.ok(redisPod.containers[0].volumeMounts.some((m: Obj) => m.mountPath === '/tls'));

  const port = await freePort();
  const dir = path.join(tmp, 'redis');
  fs.mkdirSync(dir);
  const start = localize(scripts['start-redis.sh'], dir).replace('tls-port 6379', `tls-port ${port}`).replace(/exec redis-server (\S+)/, 'exec redis-server $1 --bind 127.0.0.1');
  assert.not.equal(start, localize(scripts['start-redis.sh'], dir), 'the script turns TLS on');
  fs.writeFileSync(path.join(dir, 'start.sh'), start);
  const log = fs.openSync(path.join(dir, 'out.log'), 'a');
  proc = spawn('sh', [path.join(dir, 'start.sh')], { stdio: ['ignore', log, log], cwd: dir });
  fs.closeSync(log);
  const probe = () => {
    try {
      execFileSync('sh', ['-c', localize(scripts['ping.sh'], dir), 'ping.sh', String(port)], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };
  await waitFor(probe, 'the manifest\'s readiness probe passes over TLS', { timeoutMs: 5000, describe: () => fs.readFileSync(path.join(dir, 'out.log'), 'utf8') });

  const local = (ca: string) => storeUrl.replace('tether-redis.tether-system.svc:6379', `127.0.0.1:${port}`).replace('/var/run/tether/redis-tls/ca.crt', path.join(tmp, ca));
  const url = withRedisPassword(local('ca.crt'), PASSWORD);
  assert.is(parseRedisUrl(url).where, `redis at 127.0.0.1:${port} (TLS)`);
  const store = await RedisStore.connect(url, { keyPrefix: 't:' });
  try {
    const out = await store.allocateAddresses('float', 'egress/shop/out#0', { count: 1, candidates: ['198.51.100.1'] });
    assert.equal(out, { ok: true, addresses: ['198.51.100.1'] });
    assert.equal([...(await store.listAddresses('float')).entries()], [['198.51.100.1', 'egress/shop/out#0']]);
  } finally {
    await store.close();
  }
  // The other stores take the same client factory: the load balancer's connection set comes up too.
  const lb = await connectLbStore(url, { keyPrefix: 't:' });
  try {
    await waitFor(() => lb.connection.connected, 'the lb store connects over TLS');
  } finally {
    await lb.close();
  }

  // A server whose certificate the given CA did not sign: refused, naming the certificate.
  const wrong = await RedisStore.connect(withRedisPassword(local('other-ca.crt'), PASSWORD), { keyPrefix: 't:', connectTimeoutMs: 1000 }).then(
    async (s) => {
      await s.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  assert.instance(wrong, TetherError);
  assert.match((wrong as Error).message, /cluster store \(redis at 127\.0\.0\.1:\d+ \(TLS\)\) unreachable: its TLS certificate was refused: .*certificate.* \(SELF_SIGNED_CERT_IN_CHAIN\)/);
  // Plain text to the TLS port gets nothing.
  const plain = await RedisStore.connect(withRedisPassword(`redis://127.0.0.1:${port}`, PASSWORD), { keyPrefix: 't:', connectTimeoutMs: 500 }).then(
    async (s) => {
      await s.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  assert.instance(plain, TetherError, 'a plain connection to the TLS port does not work');

  // Bad TLS URLs are refused when parsed (tetherd checks --redis before it starts).
  const bad: Array<[string, RegExp]> = [
    [`rediss://127.0.0.1:${port}?ca=ca.crt`, /ca must be an absolute file path/],
    [`rediss://127.0.0.1:${port}?ca=${tmp}/missing.crt`, /CA certificate file .*missing\.crt cannot be read: ENOENT/],
    [`rediss://127.0.0.1:${port}?ca=${tmp}/san.ext`, /holds no PEM certificate/],
    [`rediss://127.0.0.1:${port}?cert=x`, /unknown parameter "cert"/],
    ['rediss+sentinel://h:26379/tether', /not supported: TLS to the store is supported to one server/],
    ['rediss+cluster://h:6379', /not supported/],
  ];
  for (const [u, re] of bad) {
    const e = (() => {
      try {
        parseRedisUrl(u);
        return undefined;
      } catch (x) {
        return x;
      }
    })();
    assert.instance(e, TetherError, u);
    assert.is((e as TetherError).code, ErrorCode.InvalidConfig, u);
    assert.match((e as Error).message, re, u);
  }
});

test.run();
