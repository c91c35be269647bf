// tetherd's kubelet probes: /readyz names every reason it is not ready; /livez answers while the loop runs.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ProbeServer, readyAnswer } from '../../daemon/health/probe-server';
import { RoleProblems } from '../../daemon/pod/role-problems';

test('readyz: 503 while starting, naming it; 200 once started with nothing wrong', () => {
  const roles = new RoleProblems();
  let started = false;
  const s = { started: () => started, roleProblems: () => roles.list() };
  const a = readyAnswer(s);
  assert.is(a.status, 503);
  assert.match(a.body, /tetherd is starting/);
  started = true;
  assert.equal(readyAnswer(s), { status: 200, body: 'ready\n' });
});

test('readyz: a pod whose role failed keeps tetherd not ready until the role is set up or the pod goes', () => {
  const roles = new RoleProblems();
  const s = { started: () => true, roleProblems: () => roles.list() };
  assert.ok(roles.failed('shop/gw1', 'egress', "EROFS: read-only file system, open '/proc/sys/net/ipv4/ip_forward'"));
  assert.not.ok(roles.failed('shop/gw1', 'egress', 'again'), 'a repeated failure is not new (logged once)');
  roles.failed('shop/web', 'lb target', 'netns gone');
  const a = readyAnswer(s);
  assert.is(a.status, 503);
  assert.match(a.body, /pod shop\/gw1: egress role not set up since .*: again/);
  assert.match(a.body, /pod shop\/web: lb target role/);
  roles.ok('shop/gw1', 'egress');
  roles.forget('shop/web');
  assert.is(readyAnswer(s).status, 200);
});

test('readyz: the CNI configuration not chaining tether is named', () => {
  const a = readyAnswer({ started: () => true, roleProblems: () => [], cniConfig: () => ({ ready: false, why: '10-ptp.conflist (the runtime\'s choice) does not chain tether' }) });
  assert.is(a.status, 503);
  assert.match(a.body, /CNI configuration: 10-ptp.conflist/);
});

test('probe server: answers on loopback; /livez 200, /readyz follows its sources, other paths 404', async () => {
  let started = false;
  const srv = new ProbeServer({ started: () => started, roleProblems: () => [] });
  const port = await srv.listen(0);
  try {
    const get = async (p: string) => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`);
      return { status: r.status, body: await r.text() };
    };
    assert.is((await get('/livez')).status, 200);
    assert.is((await get('/readyz')).status, 503);
    started = true;
    assert.equal(await get('/readyz'), { status: 200, body: 'ready\n' });
    assert.is((await get('/metrics')).status, 404);
  } finally {
    await srv.close();
  }
});

test.run();
