// The install manifests: each kustomization builds offline (`kubectl kustomize`), every object validates
// against the Kubernetes object schemas (kubernetes-models), and the DaemonSet and RBAC keep the promises
// the README makes (no privileged container, the capabilities and mounts tetherd needs, node-critical,
// readiness tied to the socket and the conflist, least-privilege RBAC).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { generatedCrds } from '../../install/gen-crds';
import { metricsAddressOption } from '../../daemon/options';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');

function build(dir: string): Obj[] {
  let out: string;
  try {
    out = execFileSync('kubectl', ['kustomize', path.join(root, dir)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    throw new Error(`kubectl kustomize ${dir} failed (kubectl with kustomize v4+ is needed; install/deps.sh installs it): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
  }
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}

/** The kubernetes-models class for an object, e.g. apps/v1 DaemonSet → kubernetes-models/apps/v1/DaemonSet. */
function validate(o: Obj): void {
  const mod = require(`kubernetes-models/${o.apiVersion}/${o.kind}`) as Record<string, new (x: Obj) => { validate(): void }>;
  const Model = mod[o.kind] ?? mod.default;
  new Model(o).validate();
}

for (const dir of ['install', 'install/ha', 'install/uninstall']) {
  test(`${dir} builds offline and every object validates against its Kubernetes schema`, () => {
    const objs = build(dir);
    assert.ok(objs.length >= 1);
    for (const o of objs) {
      try {
        validate(o);
      } catch (e) {
        assert.unreachable(`${o.kind} ${o.metadata?.name}: ${(e as Error).message.slice(0, 400)}`);
      }
    }
  });
}

/** Every container of every workload in the objects, with its pod spec. */
function containersOf(objs: Obj[]): Array<{ where: string; pod: Obj; c: Obj }> {
  return objs.filter((o) => ['DaemonSet', 'Deployment', 'StatefulSet', 'Job'].includes(o.kind)).flatMap((o) => {
    const pod = o.spec.template.spec;
    return [...(pod.initContainers ?? []), ...(pod.containers ?? [])].map((c: Obj) => ({ where: `${o.kind} ${o.metadata.name}, container ${c.name}`, pod, c }));
  });
}

/** The problems of the hardening every container must have: RuntimeDefault seccomp; spc_t exactly where it writes host paths. */
function hardeningProblems(objs: Obj[]): string[] {
  const out: string[] = [];
  for (const { where, pod, c } of containersOf(objs)) {
    const seccomp = c.securityContext?.seccompProfile ?? pod.securityContext?.seccompProfile;
    if (seccomp?.type !== 'RuntimeDefault') out.push(`${where}: seccompProfile ${JSON.stringify(seccomp)} (want RuntimeDefault, on the container or its pod)`);
    const hostWrites = (c.volumeMounts ?? []).filter((m: Obj) => !m.readOnly && pod.volumes?.find((v: Obj) => v.name === m.name)?.hostPath);
    const writesHost = c.securityContext?.privileged === true || hostWrites.length > 0;
    const type = c.securityContext?.seLinuxOptions?.type ?? pod.securityContext?.seLinuxOptions?.type;
    if (writesHost && type !== 'spc_t') out.push(`${where}: writes host paths (${hostWrites.map((m: Obj) => m.mountPath).join(', ') || 'privileged'}) without seLinuxOptions type spc_t`);
    if (!writesHost && type === 'spc_t') out.push(`${where}: spc_t (unconfined) on a container that writes no host path`);
  }
  return out;
}

for (const dir of ['install', 'install/ha', 'install/uninstall']) {
  test(`${dir}: every container under RuntimeDefault seccomp, spc_t on exactly those writing host paths`, () => {
    const objs = build(dir);
    assert.ok(containersOf(objs).length >= 1);
    assert.equal(hardeningProblems(objs), []);
  });
}

test('the hardening check finds a container without seccomp, a host writer without spc_t, and spc_t where none is needed', () => {
  const pod = (c: Obj, sc?: Obj) => ({ kind: 'DaemonSet', metadata: { name: 'x' }, spec: { template: { spec: { securityContext: sc, containers: [c], volumes: [{ name: 'h', hostPath: { path: '/opt/cni/bin' } }] } } } });
  assert.equal(hardeningProblems([pod({ name: 'a' })]).length, 1);
  assert.equal(hardeningProblems([pod({ name: 'b', volumeMounts: [{ name: 'h', mountPath: '/h' }] }, { seccompProfile: { type: 'RuntimeDefault' } })]).length, 1);
  assert.equal(hardeningProblems([pod({ name: 'c', volumeMounts: [{ name: 'h', mountPath: '/h', readOnly: true }], securityContext: { seLinuxOptions: { type: 'spc_t' } } }, { seccompProfile: { type: 'RuntimeDefault' } })]).length, 1);
  assert.equal(hardeningProblems([pod({ name: 'd', volumeMounts: [{ name: 'h', mountPath: '/h' }], securityContext: { seLinuxOptions: { type: 'spc_t' } } }, { seccompProfile: { type: 'RuntimeDefault' } })]), []);
});

test('cni-watch: no DAC_OVERRIDE, read-only root, its own state dir only (not tetherd\'s)', () => {
  const ds = build('install').find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  const pod = ds.spec.template.spec;
  const w = pod.containers.find((c: Obj) => c.name === 'cni-watch');
  assert.equal(w.securityContext.capabilities, { drop: ['ALL'], add: ['CHOWN', 'DAC_READ_SEARCH', 'FOWNER'] });
  assert.is(w.securityContext.readOnlyRootFilesystem, true);
  const hostPaths = w.volumeMounts.map((m: Obj) => pod.volumes.find((v: Obj) => v.name === m.name).hostPath.path).sort();
  assert.equal(hostPaths, ['/etc/cni/net.d', '/opt/cni/bin', '/var/lib/tether/cni-install']);
  const stateDir = w.command.find((a: string) => a.startsWith('--state-dir=')).split('=')[1];
  assert.ok(w.volumeMounts.some((m: Obj) => m.mountPath === stateDir), 'its --state-dir is its mount');
});

test('a bad manifest fails the same validation (the check can fail)', () => {
  assert.throws(() => validate({ apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'x' }, spec: { template: {} } }), /selector/);
  assert.throws(() => validate({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'x' }, data: { a: 5 } }), /data/);
});

test('the install holds the CRDs exactly as generated, the DaemonSet as promised, least-privilege RBAC', () => {
  const objs = build('install');
  const crds = objs.filter((o) => o.kind === 'CustomResourceDefinition');
  assert.equal(crds.map((c) => c.metadata.name).sort(), ['addressblocks.tether.dev', 'addresspools.tether.dev', 'egresses.tether.dev', 'tethernodes.tether.dev']);
  const gen = [...generatedCrds().entries()].filter(([f]) => f !== 'kustomization.yaml').map(([, t]) => parseAllDocuments(t)[0].toJS() as Obj);
  for (const g of gen) assert.equal(crds.find((c) => c.metadata.name === g.metadata.name), g);

  const ds = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  const spec = ds.spec.template.spec;
  assert.is(spec.priorityClassName, 'system-node-critical');
  assert.is(spec.hostNetwork, true);
  assert.equal(spec.tolerations, [{ operator: 'Exists' }]);
  assert.not.ok(spec.hostPID, 'no host PID namespace');
  // Only the bpffs mount may be privileged (Bidirectional propagation needs it), and it runs once, first.
  const bpffsInit = spec.initContainers[0];
  assert.is(bpffsInit.name, 'mount-bpf-fs');
  assert.is(bpffsInit.securityContext.privileged, true);
  assert.equal(bpffsInit.volumeMounts, [{ name: 'bpffs', mountPath: '/sys/fs/bpf', mountPropagation: 'Bidirectional' }]);
  assert.not.ok(spec.containers.some((c: Obj) => c.securityContext?.privileged), 'no long-running container is privileged');
  for (const c of [...spec.initContainers.slice(1), ...spec.containers]) {
    assert.not.ok(c.securityContext?.privileged, `${c.name} is not privileged`);
    assert.is(c.securityContext?.allowPrivilegeEscalation, false, `${c.name}: no privilege escalation`);
    assert.equal(c.securityContext?.capabilities?.drop, ['ALL'], `${c.name} drops every capability it does not add`);
  }
  const tetherd = spec.containers.find((c: Obj) => c.name === 'tetherd');
  for (const cap of ['NET_ADMIN', 'NET_RAW', 'SYS_ADMIN', 'BPF', 'PERFMON']) assert.ok(tetherd.securityContext.capabilities.add.includes(cap), cap);
  assert.not.ok(tetherd.securityContext.capabilities.add.includes('SYS_PTRACE'), 'no SYS_PTRACE');
  assert.equal(tetherd.securityContext.seccompProfile, { type: 'RuntimeDefault' });
  assert.equal(tetherd.securityContext.appArmorProfile, { type: 'Unconfined' });
  assert.ok(tetherd.command.includes('--kubernetes'));
  assert.ok(tetherd.command.includes('--bpffs=host'), 'tetherd never mounts a bpffs of its own in the container');
  // Probes are httpGet to tetherd's loopback probe port, not execs of a 100 MB executable.
  const probePort = Number(tetherd.command.find((a: string) => a.startsWith('--probe-port=')).split('=')[1]);
  for (const [probe, p] of [['startupProbe', '/livez'], ['readinessProbe', '/readyz'], ['livenessProbe', '/livez']]) {
    assert.equal(tetherd[probe].httpGet, { host: '127.0.0.1', port: probePort, path: p }, probe);
  }
  assert.equal(tetherd.ports.map((p: Obj) => `${p.hostPort}/${p.protocol}`).sort(), ['10266/TCP', '10267/TCP', '10268/TCP', '3784/UDP', '3785/TCP', '3785/UDP', '5555/UDP']);
  assert.is(tetherd.env.find((e: Obj) => e.name === 'TETHER_PROC_SYS_NET').value, '/host/proc/sys/net');
  assert.equal(spec.nodeSelector, { 'kubernetes.io/os': 'linux' });
  const mounts = Object.fromEntries(tetherd.volumeMounts.map((m: Obj) => [m.mountPath, m]));
  assert.is(mounts['/run/netns'].mountPropagation, 'HostToContainer');
  assert.ok(mounts['/sys/fs/bpf'] && mounts['/run/tether'] && mounts['/var/lib/tether']);
  assert.is(mounts['/sys/fs/bpf'].mountPropagation, 'HostToContainer');
  assert.not.ok(mounts['/host/proc/sys/net'].readOnly, 'the host\'s net sysctls are writable through their own mount');
  assert.equal(spec.initContainers[1].command.slice(0, 2), ['/usr/local/bin/tether-install', 'install']);
  assert.ok(spec.containers.some((c: Obj) => c.command[1] === 'watch'), 'a container keeps tether in the conflist');
  assert.ok(tetherd.image.startsWith('ghcr.io/tether-cni/tether:'), 'the image is pinned by kustomize');

  for (const r of objs.filter((o) => o.kind === 'ClusterRole' || o.kind === 'Role')) {
    for (const rule of r.rules) {
      assert.not.ok(rule.verbs.includes('*') || rule.resources.includes('*') || (rule.apiGroups ?? []).includes('*'), `${r.kind} ${r.metadata.name}: no wildcards`);
    }
  }
  const cluster = objs.find((o) => o.kind === 'ClusterRole' && o.metadata.name === 'tether')!;
  const may = (group: string, resource: string, verb: string) => cluster.rules.some((rule: Obj) => rule.apiGroups.includes(group) && rule.resources.includes(resource) && rule.verbs.includes(verb));
  for (const verb of ['create', 'patch']) assert.ok(may('events.k8s.io', 'events', verb), `events: ${verb} (Events, their series)`);
  for (const verb of ['get', 'create', 'update']) assert.ok(may('tether.dev', 'tethernodes', verb), `tethernodes: ${verb}`);
  assert.ok(may('tether.dev', 'tethernodes/status', 'update'), 'tethernodes/status: update');
  assert.not.ok(may('tether.dev', 'tethernodes', 'delete') || may('tether.dev', 'tethernodes', 'list'), 'a node neither lists nor deletes TetherNodes');
  assert.not.ok(cluster.rules.some((rule: Obj) => rule.resources.includes('secrets')), 'no cluster-wide access to Secrets');
  assert.not.ok(cluster.rules.some((rule: Obj) => rule.resources.some((x: string) => ['addresspools', 'egresses'].includes(x)) && rule.verbs.some((v: string) => ['update', 'patch', 'create', 'delete'].includes(v))), 'the spec of AddressPools and Egresses is read-only to tetherd');
});

/** Every (apiGroup, resource, verb, resourceNames) a ServiceAccount is granted in the rendered install, through its bindings. */
function grants(objs: Obj[], sa: string): Array<{ group: string; resource: string; verb: string; names?: string[]; namespace?: string }> {
  const out: Array<{ group: string; resource: string; verb: string; names?: string[]; namespace?: string }> = [];
  for (const b of objs.filter((o) => o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding')) {
    if (!b.subjects.some((x: Obj) => x.kind === 'ServiceAccount' && x.name === sa && x.namespace === 'tether-system')) continue;
    const role = objs.find((o) => o.kind === b.roleRef.kind && o.metadata.name === b.roleRef.name && (b.roleRef.kind === 'ClusterRole' || o.metadata.namespace === b.metadata.namespace));
    assert.ok(role, `${b.kind} ${b.metadata.name}: its ${b.roleRef.kind} ${b.roleRef.name} is in the install`);
    for (const rule of role.rules) for (const group of rule.apiGroups) for (const resource of rule.resources) for (const verb of rule.verbs) {
      out.push({ group, resource, verb, names: rule.resourceNames, namespace: b.kind === 'RoleBinding' ? b.metadata.namespace : undefined });
    }
  }
  return out;
}

test("tetherd's ServiceAccount has no cluster-wide write; the operator's has exactly the cluster's writes", () => {
  const objs = build('install');
  const node = grants(objs, 'tether');
  const op = grants(objs, 'tether-operator');
  const has = (g: typeof node, group: string, resource: string, verb: string) => g.some((x) => x.group === group && x.resource === resource && x.verb === verb);
  // tetherd: no Lease at all, no Service write, no status of the cluster's objects, no Secret create.
  assert.equal(node.filter((x) => x.resource === 'leases'), [], 'tetherd: no Lease verb');
  for (const verb of ['create', 'update', 'patch', 'delete']) assert.not.ok(has(node, '', 'services', verb), `tetherd: services ${verb}`);
  for (const r of ['services/status', 'egresses/status', 'addresspools/status']) assert.equal(node.filter((x) => x.resource === r), [], `tetherd: no ${r} verb`);
  assert.not.ok(has(node, '', 'secrets', 'create') || has(node, '', 'secrets', 'list') || has(node, '', 'secrets', 'watch'), 'tetherd: Secrets neither created nor listed');
  assert.equal(node.filter((x) => x.resource === 'secrets').map((x) => [x.verb, x.names]), [['get', ['tether-cluster-key', 'tether-redis-auth']]], 'tetherd: the cluster Secrets, get by name');
  for (const verb of ['create', 'delete']) assert.ok(has(node, 'tether.dev', 'addressblocks', verb), `tetherd: addressblocks ${verb} (its own node's: the admission policy)`);
  // The operator: the Lease by name, the Service label and status, the objects' status, Secrets created.
  assert.ok(has(op, 'coordination.k8s.io', 'leases', 'create'), 'operator: Lease create');
  for (const verb of ['get', 'update']) {
    const l = op.filter((x) => x.resource === 'leases' && x.verb === verb);
    assert.ok(l.length && l.every((x) => x.names?.join() === 'tether-operator' && x.namespace === 'tether-system'), `operator: Lease ${verb} only on tether-system/tether-operator`);
  }
  assert.ok(has(op, '', 'services', 'patch'), 'operator: services patch (the label)');
  for (const r of ['services/status', 'egresses/status', 'addresspools/status']) assert.ok(has(op, r === 'services/status' ? '' : 'tether.dev', r, 'update'), `operator: ${r} update`);
  for (const verb of ['list', 'watch', 'delete']) assert.ok(has(op, 'tether.dev', 'addressblocks', verb), `operator: addressblocks ${verb}`);
  assert.not.ok(has(op, 'tether.dev', 'addressblocks', 'create'), 'operator: never creates a block claim');
  assert.ok(op.some((x) => x.resource === 'secrets' && x.verb === 'create' && x.namespace === 'tether-system'), 'operator: Secret create in tether-system only');
  assert.not.ok(op.some((x) => x.resource === 'secrets' && x.verb === 'get' && !x.names), 'operator: Secrets read by name only');
  assert.ok(has(op, 'events.k8s.io', 'events', 'create'), 'operator: Events');
  for (const r of ['tethernodes', 'tethernodes/status']) assert.not.ok(op.some((x) => x.resource === r), `operator: no ${r}`);
});

test('the operator: a Deployment of 2 replicas, its own ServiceAccount, the same image, no privilege', () => {
  const objs = build('install');
  const dep = objs.find((o) => o.kind === 'Deployment' && o.metadata.name === 'tether-operator')!;
  assert.ok(dep, 'Deployment tether-operator');
  assert.is(dep.metadata.namespace, 'tether-system');
  assert.is(dep.spec.replicas, 2);
  const spec = dep.spec.template.spec;
  assert.is(spec.serviceAccountName, 'tether-operator');
  assert.ok(objs.some((o) => o.kind === 'ServiceAccount' && o.metadata.name === 'tether-operator' && o.metadata.namespace === 'tether-system'));
  assert.not.ok(spec.hostNetwork, 'not on the host network');
  assert.equal(spec.volumes.filter((v: Obj) => v.hostPath), [], 'no host path');
  const [c] = spec.containers;
  const ds = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  assert.is(c.image, ds.spec.template.spec.containers.find((x: Obj) => x.name === 'tetherd').image, 'the same image as tetherd');
  assert.equal(c.command.slice(0, 2), ['/usr/local/bin/tether-operator', '--kubernetes']);
  const sc = c.securityContext;
  assert.equal([sc.privileged, sc.allowPrivilegeEscalation, sc.readOnlyRootFilesystem, sc.runAsNonRoot], [false, false, true, true]);
  assert.equal(sc.capabilities, { drop: ['ALL'] });
  assert.equal(sc.seccompProfile, { type: 'RuntimeDefault' });
  const probePort = Number(c.command.find((a: string) => a.startsWith('--probe-port=')).split('=')[1]);
  for (const [probe, p] of [['startupProbe', '/livez'], ['livenessProbe', '/livez'], ['readinessProbe', '/readyz']]) assert.equal(c[probe].httpGet, { port: probePort, path: p }, probe);
  // Metrics on the pod's address, on a port of their own that the container declares (the PodMonitor's).
  const metricsFlag = c.command.filter((a: string) => a.startsWith('--metrics-bind-address='));
  assert.equal(metricsFlag, ['--metrics-bind-address=0.0.0.0:10270']);
  const metricsAt = metricsAddressOption(metricsFlag[0].split('=')[1])!;
  assert.equal(c.ports.find((p: Obj) => p.name === 'metrics'), { name: 'metrics', containerPort: metricsAt.port, protocol: 'TCP' });
  assert.is.not(metricsAt.port, probePort, 'not the probes\' port');
  assert.ok(c.ports.some((p: Obj) => p.name === 'probes' && p.containerPort === probePort));
  // install/monitoring's PodMonitor for the operator scrapes that port of these pods.
  const monitors = parseAllDocuments(fs.readFileSync(path.join(root, 'install/monitoring/pod-monitor.yaml'), 'utf8')).map((d) => d.toJS() as Obj);
  const pm = monitors.find((m) => m.kind === 'PodMonitor' && m.metadata.name === 'tether-operator')!;
  assert.ok(pm, 'PodMonitor tether-operator');
  assert.equal(pm.spec.selector.matchLabels, dep.spec.selector.matchLabels, 'it selects the operator\'s pods');
  assert.equal(pm.spec.podMetricsEndpoints.map((e: Obj) => [e.port, e.path]), [['metrics', '/metrics']]);
  assert.ok(c.env.some((e: Obj) => e.name === 'TETHER_REDIS_URL'), 'the store URL');
  // Passing --controller-candidates to tetherd only earns a warning now: the manifest no longer does.
  assert.not.ok(ds.spec.template.spec.containers.some((x: Obj) => x.command.some((a: string) => a.startsWith('--controller-candidates'))));
});

test.run();
