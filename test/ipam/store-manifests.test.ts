// The cluster store as the manifests deploy it, run for real: the start scripts of install/ (single Redis)
// and install/ha (Redis + Sentinel), taken from `kubectl kustomize`'s output, run here with Debian's
// redis-server (only the pod's paths, host names and ports are rewritten to this machine's). Checked: a
// password is required (from the Secret's file, never on a command line), protected mode is on, a full store
// refuses writes instead of evicting records, replicas and sentinels authenticate, and tetherd's store
// client gets in with the Secret's password and says so clearly when the password is wrong.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { RedisStore } from '../../ipam/store/redis-store';
import { parseRedisUrl, withRedisPassword } from '../../daemon/common/redis';
import { TetherError } from '../../lib/errors';
import { waitFor } from '../lib/wait';
import { freePort } from '../lib/ports';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');
const PASSWORD = 'pw-Zq3_x9fL0aTm7Yb2'; // base64url, as tetherd generates it

function build(dir: string): Obj[] {
  const out = execFileSync('kubectl', ['kustomize', path.join(root, dir)], { encoding: 'utf8' });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}

function scripts(dir: string, cm: string): Record<string, string> {
  const o = build(dir).find((x) => x.kind === 'ConfigMap' && x.metadata.name === cm);
  if (!o) throw new Error(`${dir} has no ConfigMap ${cm}`);
  return o.data;
}

const procs: ChildProcess[] = [];
let tmp = '';

test.before(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-store-manifests-'));
  fs.mkdirSync(path.join(tmp, 'auth'));
  fs.writeFileSync(path.join(tmp, 'auth/password'), PASSWORD, { mode: 0o400 });
});

test.after(async () => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  await new Promise((r) => setTimeout(r, 100));
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});


/** The pod's paths and names rewritten to this machine's; the script otherwise as the manifest has it. */
function localize(script: string, name: string, dir: string, rewrite: Array<[RegExp, string]> = []): string {
  let s = script.replaceAll('/auth/', `${tmp}/auth/`).replaceAll('/conf/', `${dir}/`).replaceAll('/data/', `${dir}/`).replaceAll('$(hostname)', name);
  for (const [re, to] of rewrite) s = s.replace(re, to);
  return s;
}

function run(script: string, dir: string): ChildProcess {
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'start.sh');
  fs.writeFileSync(file, script);
  const log = fs.openSync(path.join(dir, 'out.log'), 'a');
  const p = spawn('sh', [file], { stdio: ['ignore', log, log], cwd: dir });
  fs.closeSync(log);
  procs.push(p);
  return p;
}

function cli(port: number, args: string[], password?: string): { code: number; out: string } {
  try {
    const out = execFileSync('sh', ['-c', 'redis-cli --no-auth-warning "$@" 2>&1', 'cli', '-p', String(port), ...args], { encoding: 'utf8', env: { ...process.env, ...(password ? { REDISCLI_AUTH: password } : {}) }, stdio: ['ignore', 'pipe', 'pipe'] });
    return { code: 0, out: out.trim() };
  } catch (e) {
    return { code: (e as { status?: number }).status ?? 1, out: String((e as { stdout?: string }).stdout ?? '').trim() };
  }
}

/** The manifest's readiness probe (ping.sh), localized. */
function probe(ping: string, port: number): boolean {
  try {
    execFileSync('sh', ['-c', localize(ping, 'x', tmp), 'ping.sh', String(port)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

test('install/: the single Redis requires the Secret\'s password (not on its command line), protected mode on, noeviction under a memory cap; tetherd gets in with it and names a wrong one', async () => {
  const s = scripts('install', 'tether-redis');
  const port = await freePort();
  const dir = path.join(tmp, 'single');
  const p = run(localize(s['start-redis.sh'], 'tether-redis', dir, [[/exec redis-server (\S+)/, `exec redis-server $1 --port ${port} --bind 127.0.0.1`]]), dir);
  await waitFor(() => probe(s['ping.sh'], port), 'the manifest\'s readiness probe passes', { timeoutMs: 5000 });
  assert.match(cli(port, ['ping']).out, /NOAUTH/, 'no password: refused');
  const wrong = cli(port, ['ping'], 'wrong');
  assert.is.not(wrong.out, 'PONG', 'a wrong password: refused');
  assert.match(wrong.out, /WRONGPASS|NOAUTH|AUTH failed/);
  assert.is(cli(port, ['config', 'get', 'protected-mode'], PASSWORD).out.split('\n')[1], 'yes');
  assert.is(cli(port, ['config', 'get', 'maxmemory-policy'], PASSWORD).out.split('\n')[1], 'noeviction');
  assert.ok(Number(cli(port, ['config', 'get', 'maxmemory'], PASSWORD).out.split('\n')[1]) > 0, 'a memory cap Redis knows of');
  // The password is in a 0600 file, not in any process's command line.
  const conf = path.join(dir, 'redis.conf');
  assert.is(fs.statSync(conf).mode & 0o777, 0o600);
  // The script execs redis-server: its pid is the server's (children, if any, are checked too).
  let children: string[] = [];
  try {
    children = execFileSync('pgrep', ['-P', String(p.pid)], { encoding: 'utf8' }).trim().split('\n');
  } catch {
    // no children
  }
  assert.match(fs.readFileSync(`/proc/${p.pid}/cmdline`, 'utf8'), /redis-server/);
  const pids = [...children, String(p.pid)];
  for (const pid of pids) assert.not.ok(fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(PASSWORD), `pid ${pid}'s command line holds the password`);

  // tetherd's store client: the URL of the generated ConfigMap with the Secret's password put in.
  const url = `redis://127.0.0.1:${port}`;
  const store = await RedisStore.connect(withRedisPassword(url, PASSWORD), { keyPrefix: 'm:' });
  try {
    assert.equal([...(await store.listAddresses('float')).entries()], []);
  } finally {
    await store.close();
  }
  const err = await RedisStore.connect(withRedisPassword(url, 'not-the-password'), { keyPrefix: 'm:', connectTimeoutMs: 1000 }).then(
    async (st) => {
      await st.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  assert.instance(err, TetherError);
  assert.match((err as Error).message, /refused authentication: WRONGPASS/);
});

/**
 * install/ha's scripts for one pod, localized: every host name is this machine, each pod's Redis has its
 * own port (`port`), the sentinels are one at `sp` and the primary of a new install is at `p0`.
 */
function haScript(s: Record<string, string>, script: string, name: string, dir: string, ports: { port?: number; sp: number; p0: number }, rewrite: Array<[RegExp, string]> = []): string {
  const find = s['find-primary.sh']
    .replace(/^me=.*$/m, 'me=127.0.0.1')
    .replace(/^REDIS_PORT=6379$/m, `REDIS_PORT=${ports.port ?? 6379}`)
    .replace(/^SENTINEL_PORT=26379$/m, `SENTINEL_PORT=${ports.sp}`)
    .replace(/^first=.*$/m, `first="127.0.0.1 ${ports.p0}"`)
    .replaceAll('-h "$peer.$SVC"', '-h 127.0.0.1');
  assert.ok(s[script].includes('. /scripts/find-primary.sh'), `${script} sources find-primary.sh`);
  return localize(s[script].replace('. /scripts/find-primary.sh', () => find), name, dir, [[/"\$me"/g, '127.0.0.1'], ...rewrite]);
}

test('install/ha: replicas authenticate to the primary (masterauth), sentinels need the password and use it (auth-pass); tetherd through Sentinel gets in; a primary restarted before the sentinels failed over waits for them and keeps the data', async () => {
  const s = scripts('install/ha', 'tether-redis-ha');
  const [p0, p1, sp] = [await freePort(), await freePort(), await freePort()];
  const startRedis = (name: string, port: number, dir = path.join(tmp, name)) =>
    run(haScript(s, 'start-redis.sh', name, dir, { port, sp, p0 }, [[/exec redis-server (\S+)/, `exec redis-server $1 --port ${port} --bind 127.0.0.1`]]), dir);
  const pod0 = startRedis('tether-redis-ha-0', p0);
  await waitFor(() => probe(s['ping.sh'], p0), 'primary ready', { timeoutMs: 5000 });
  startRedis('tether-redis-ha-1', p1);
  await waitFor(() => /master_link_status:up/.test(cli(p1, ['info', 'replication'], PASSWORD).out), 'the replica is in sync with the primary (it authenticated with masterauth)', { timeoutMs: 10_000, describe: () => cli(p1, ['info', 'replication'], PASSWORD).out });
  assert.match(cli(p1, ['ping']).out, /NOAUTH/, 'the replica requires the password too');

  const sdir = path.join(tmp, 'sentinel');
  run(haScript(s, 'start-sentinel.sh', 'tether-redis-ha-2', sdir, { sp, p0 }, [[/^QUORUM=2$/m, 'QUORUM=1'], [/exec redis-server "\$conf" --sentinel/, 'exec redis-server "$conf" --sentinel --bind 127.0.0.1']]), sdir);
  await waitFor(() => probe(s['ping.sh'], sp), 'the sentinel answers with the password', { timeoutMs: 5000 });
  assert.match(cli(sp, ['ping']).out, /NOAUTH/, 'the sentinel requires the password');
  await waitFor(() => /num-slaves\n1/.test(cli(sp, ['sentinel', 'master', 'tether'], PASSWORD).out), 'the sentinel monitors the primary with the password (auth-pass)', { timeoutMs: 10_000, describe: () => cli(sp, ['sentinel', 'master', 'tether'], PASSWORD).out });
  assert.is(fs.statSync(path.join(sdir, 'sentinel.conf')).mode & 0o777, 0o600);

  const url = withRedisPassword(`redis+sentinel://127.0.0.1:${sp}/tether`, PASSWORD);
  const store = await RedisStore.connect(url, { keyPrefix: 'h:' });
  try {
    assert.equal([...(await store.listAddresses('float')).entries()], []);
  } finally {
    await store.close();
  }

  // Pod 0, the primary, restarts at once (a crash, a rolled pod): it comes back empty before the sentinels
  // noticed it was gone. Started as the primary again, it would have the replica copy its empty data set.
  assert.is(cli(p0, ['set', 'kept', 'yes'], PASSWORD).out, 'OK');
  await waitFor(() => cli(p1, ['get', 'kept'], PASSWORD).out === 'yes', 'the key reached the replica');
  pod0.kill('SIGKILL');
  await new Promise((r) => pod0.once('exit', r));
  startRedis('tether-redis-ha-0', p0, path.join(tmp, 'tether-redis-ha-0-again'));
  await waitFor(() => cli(sp, ['sentinel', 'get-master-addr-by-name', 'tether'], PASSWORD).out.endsWith(String(p1)), 'the sentinel promoted the replica', { timeoutMs: 20_000 });
  await waitFor(() => /role:slave/.test(cli(p0, ['info', 'replication'], PASSWORD).out) && /master_link_status:up/.test(cli(p0, ['info', 'replication'], PASSWORD).out), 'the restarted pod 0 replicates the new primary', { timeoutMs: 20_000, describe: () => cli(p0, ['info', 'replication'], PASSWORD).out });
  assert.is(cli(p1, ['get', 'kept'], PASSWORD).out, 'yes', 'the data survived on the new primary');
  assert.is(cli(p0, ['get', 'kept'], PASSWORD).out, 'yes', 'and reached the restarted pod');
});

test('install/ → install/ha: the store URL is a generated ConfigMap, so the DaemonSet rolls by itself; what install/ha leaves behind is exactly the single Redis', () => {
  const one = build('install');
  const ha = build('install/ha');
  const key = (o: Obj) => `${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
  const haKeys = new Set(ha.map(key));
  const left = one.filter((o) => !haKeys.has(key(o))).map(key).sort();
  const store = (objs: Obj[]) => objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('tether-store-'))!.metadata.name as string;
  assert.equal(left, [`ConfigMap/tether-system/${store(one)}`, 'ConfigMap/tether-system/tether-redis', 'Deployment/tether-system/tether-redis', 'Service/tether-system/tether-redis'].sort());
  const ds = (objs: Obj[]) => objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  const ref = (objs: Obj[]) => ds(objs).spec.template.spec.containers[0].env.find((e: Obj) => e.name === 'TETHER_REDIS_URL').valueFrom.configMapKeyRef.name;
  assert.is(ref(one), store(one));
  assert.is(ref(ha), store(ha));
  assert.is.not(ref(one), ref(ha), 'another store is another ConfigMap name: the DaemonSet template changes and rolls');
  // Same password Secret, same NetworkPolicy on both.
  const args = (objs: Obj[]) => ds(objs).spec.template.spec.containers[0].command as string[];
  assert.ok(args(one).includes('--redis-password-secret=tether-redis-auth') && args(ha).includes('--redis-password-secret=tether-redis-auth'));
  for (const objs of [one, ha]) assert.ok(objs.some((o) => o.kind === 'NetworkPolicy' && o.metadata.name === 'tether-store'));
  // Never two single Redis pods at once behind the Service (a rolling update would run the new one beside the old).
  assert.equal(one.find((o) => o.kind === 'Deployment' && o.metadata.name === 'tether-redis')!.spec.strategy, { type: 'Recreate' });
  // The Redis pods read the Secrets' files (root's without an fsGroup) as group 999.
  for (const objs of [one, ha]) for (const o of objs.filter((x) => /^tether-redis/.test(x.metadata.name) && (x.kind === 'Deployment' || x.kind === 'StatefulSet'))) {
    const pod = o.spec.template.spec;
    assert.is(pod.securityContext?.fsGroup, 999, o.metadata.name);
    assert.ok(pod.containers.every((c: Obj) => c.securityContext.runAsUser === 999), o.metadata.name);
    assert.is(pod.volumes.find((v: Obj) => v.name === 'auth').secret.defaultMode, 0o440, o.metadata.name);
  }
  assert.ok(ha.some((o) => o.kind === 'PodDisruptionBudget' && o.spec.maxUnavailable === 1), 'a drain takes one of the three Sentinel pods at a time');

  // docs/install.md's steps: applying install/ha, then its delete commands remove exactly what is left.
  const doc = fs.readFileSync(path.join(root, 'docs/install.md'), 'utf8');
  const section = doc.slice(doc.indexOf('### From a single Redis to Sentinel'));
  const steps = section.slice(0, section.indexOf('\n## ') >= 0 ? section.indexOf('\n## ') : undefined).split('\n').filter((l) => /^\s*kubectl /.test(l)).map((l) => l.trim());
  assert.ok(steps.includes('kubectl apply -k install/ha'), steps.join('\n'));
  const KIND: Record<string, string> = { deployment: 'Deployment', service: 'Service', configmap: 'ConfigMap' };
  const deleted = new Set<string>();
  for (const l of steps.filter((x) => / delete /.test(x))) {
    const words = l.split(/\s+/);
    const ns = words[words.indexOf('-n') + 1];
    const sel = words.indexOf('-l');
    if (sel >= 0) {
      const [k, v] = words[sel + 1].split('=');
      const kind = KIND[words[words.indexOf('delete') + 1]];
      for (const o of one) if (o.kind === kind && o.metadata.namespace === ns && o.metadata.labels?.[k] === v) deleted.add(key(o));
    } else {
      for (const ref of words.slice(words.indexOf('delete') + 1).filter((w) => w.includes('/'))) {
        const [res, name] = ref.split('/');
        deleted.add(`${KIND[res]}/${ns}/${name}`);
      }
    }
  }
  assert.equal([...deleted].sort(), left, 'the documented deletes remove exactly what install/ha leaves behind');
});

test('the Secret\'s password goes into every form of store URL, once; a password in the URL wins; sentinels get it too unless the URL names theirs', () => {
  const pw = 'p@ss/w:rd';
  const rows: Array<[string, string | undefined, string | undefined, string | undefined]> = [
    // url, the servers' password, the sentinels', the user
    ['redis://h:6379/1', pw, undefined, undefined],
    ['redis://:old@h', 'old', undefined, undefined],
    ['redis://user@h', pw, undefined, 'user'],
    ['redis://[::1]:6379', pw, undefined, undefined],
    ['unix:///run/r.sock?db=2', pw, undefined, undefined],
    ['redis+sentinel://a:26379,b/tether', pw, pw, undefined],
    ['redis+sentinel://a/tether/2?sentinelPassword=x', pw, 'x', undefined],
    ['redis+cluster://a,b:7000', pw, undefined, undefined],
    ['redis+cluster://a?password=q', 'q', undefined, undefined],
  ];
  for (const [url, password, sentinelPassword, username] of rows) {
    const t = parseRedisUrl(withRedisPassword(url, pw));
    assert.equal([t.options.password, t.options.sentinelPassword, t.options.username], [password, sentinelPassword, username], url);
    assert.is(t.where, parseRedisUrl(url).where, `${url}: the same store`);
  }
  assert.throws(() => withRedisPassword('http://h', pw), /unsupported scheme/);
});

test.run();
