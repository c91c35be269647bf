// The optional monitoring component (install/monitoring), as a user adds it to install/: it builds, makes
// tetherd's metrics reachable (the bind address patched onto tetherd, in a form tetherd accepts), the
// PodMonitor selects tetherd's pods on its metrics port; the PrometheusRule's rules load in promtool and
// pass `promtool test rules` (test/fixtures/monitoring/rules-test.yaml), where every alert has a case that
// fires it; every query of the Grafana dashboard parses (promtool check rules, each as a recording rule);
// and every metric the rules and the dashboard read is one tetherd exports.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { parseAllDocuments, parse, stringify } from 'yaml';
import { makeLogger } from '../../lib/log';
import { TetherMetrics } from '../../daemon/metrics/tether-metrics';
import { metricsAddressOption } from '../../daemon/options';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');
const COMPONENT = path.join(root, 'install/monitoring');
const RULES_TEST = path.join(root, 'test/fixtures/monitoring/rules-test.yaml');
/** Metrics read by the rules that other slices of this release add to tetherd: named here until they exist. */
function promtool(args: string[], cwd: string): { code: number; out: string } {
  const r = spawnSync('promtool', args, { cwd, encoding: 'utf8' });
  if (r.error) throw new Error(`promtool not found (${r.error.message}): Debian's prometheus package provides it (install/deps.sh installs it)`);
  return { code: r.status ?? -1, out: `${r.stdout}${r.stderr}` };
}

/** install/ with the component, built as a user's kustomization would (a directory of its own naming both). */
function buildWithComponent(): Obj[] {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-mon-'));
  try {
    const rel = path.relative(dir, path.join(root, 'install'));
    fs.writeFileSync(path.join(dir, 'kustomization.yaml'), stringify({ resources: [rel], components: [`${rel}/monitoring`] }));
    const out = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const objs = buildWithComponent();
const ruleObj = objs.find((o) => o.kind === 'PrometheusRule')!;
const alerts: string[] = ruleObj.spec.groups.flatMap((g: Obj) => g.rules.filter((r: Obj) => r.alert).map((r: Obj) => r.alert));
const dashboard = JSON.parse(fs.readFileSync(path.join(COMPONENT, 'tether-dashboard.json'), 'utf8')) as Obj;

function validate(o: Obj): void {
  const mod = require(`kubernetes-models/${o.apiVersion}/${o.kind}`) as Record<string, new (x: Obj) => { validate(): void }>;
  new (mod[o.kind] ?? mod.default)(o).validate();
}

test('promtool is installed (the rule tests need it)', () => {
  const r = promtool(['--version'], root);
  assert.is(r.code, 0, r.out);
  assert.match(r.out, /promtool, version/);
});

test('the component builds with install/: Kubernetes objects validate, the monitoring objects are complete', () => {
  for (const o of objs.filter((x) => !x.apiVersion.startsWith('monitoring.coreos.com/'))) {
    try {
      validate(o);
    } catch (e) {
      assert.unreachable(`${o.kind} ${o.metadata?.name}: ${(e as Error).message.slice(0, 300)}`);
    }
  }
  // One PodMonitor per workload (its job, tether-system/NAME, is what the rules select): each selects its
  // workload's pods only and scrapes a port its container declares.
  const monitors = objs.filter((o) => o.kind === 'PodMonitor');
  assert.equal(monitors.map((m) => m.metadata.name).sort(), ['tether-operator', 'tetherd']);
  for (const [name, kind] of [['tetherd', 'DaemonSet'], ['tether-operator', 'Deployment']]) {
    const pm = monitors.find((m) => m.metadata.name === name)!;
    assert.is(pm.apiVersion, 'monitoring.coreos.com/v1');
    assert.is(pm.metadata.namespace, 'tether-system');
    const workloads = objs.filter((o) => ['DaemonSet', 'Deployment'].includes(o.kind));
    const selected = workloads.filter((w) => Object.entries(pm.spec.selector.matchLabels as Record<string, string>).every(([k, v]) => w.spec.template.metadata.labels[k] === v));
    assert.equal(selected.map((w) => `${w.kind} ${w.metadata.name}`), [`${kind} ${name}`], `PodMonitor ${name} selects the pods of ${kind} ${name} only`);
    const container = selected[0].spec.template.spec.containers.find((c: Obj) => c.name === name);
    assert.ok(container.ports.find((p: Obj) => p.name === pm.spec.podMetricsEndpoints[0].port), `PodMonitor ${name} scrapes a port ${name} declares`);
  }
  assert.ok(ruleObj.spec.groups.length > 0 && alerts.length > 0);
  const cm = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'tether-dashboard')!;
  assert.is(cm.metadata.labels.grafana_dashboard, '1');
  assert.equal(JSON.parse(cm.data['tether-dashboard.json']), dashboard);
});

test('the component makes tetherd serve metrics on the node\'s address, on the metrics port, in a form tetherd accepts', () => {
  const ds = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'tetherd')!;
  const tetherd = ds.spec.template.spec.containers.find((c: Obj) => c.name === 'tetherd');
  const flags = tetherd.command.filter((a: string) => a.startsWith('--metrics-bind-address='));
  assert.equal(flags, ['--metrics-bind-address=$(HOST_IP):10268'], 'patched onto tetherd (container 0), once');
  assert.ok(tetherd.env.some((e: Obj) => e.name === 'HOST_IP' && e.valueFrom?.fieldRef?.fieldPath === 'status.hostIP'), '$(HOST_IP) is defined before use');
  const expanded = flags[0].split('=')[1].replace('$(HOST_IP)', '10.0.0.1');
  assert.equal(metricsAddressOption(expanded), { host: '10.0.0.1', port: tetherd.ports.find((p: Obj) => p.name === 'metrics').containerPort });
  // Without the component tetherd keeps its default (127.0.0.1).
  const plain = parseAllDocuments(execFileSync('kubectl', ['kustomize', path.join(root, 'install')], { encoding: 'utf8' })).map((d) => d.toJS() as Obj);
  const plainTetherd = plain.find((o) => o?.kind === 'DaemonSet')!.spec.template.spec.containers.find((c: Obj) => c.name === 'tetherd');
  assert.not.ok(plainTetherd.command.some((a: string) => a.startsWith('--metrics-bind-address')));
});

test('the PrometheusRule loads in promtool and passes `promtool test rules`; every alert fires in some case', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-rules-'));
  try {
    fs.writeFileSync(path.join(dir, 'rules.yaml'), stringify({ groups: ruleObj.spec.groups }));
    fs.copyFileSync(RULES_TEST, path.join(dir, 'rules-test.yaml'));
    const check = promtool(['check', 'rules', 'rules.yaml'], dir);
    assert.is(check.code, 0, check.out);
    const run = promtool(['test', 'rules', 'rules-test.yaml'], dir);
    assert.is(run.code, 0, run.out);
    assert.match(run.out, /SUCCESS/);

    const cases = (parse(fs.readFileSync(RULES_TEST, 'utf8')) as Obj).tests.flatMap((t: Obj) => t.alert_rule_test ?? []);
    const fired = new Set(cases.filter((c: Obj) => (c.exp_alerts ?? []).length > 0).map((c: Obj) => c.alertname));
    assert.equal(alerts.filter((a) => !fired.has(a)), [], 'alerts without a case where they fire');
    for (const a of alerts) assert.match(fs.readFileSync(path.join(root, 'docs/operations.md'), 'utf8'), new RegExp(`\\b${a}\\b`), `docs/operations.md explains ${a}`);

    // The same run fails when a rule changes under its test (the check can fail).
    const broken = structuredClone(ruleObj.spec.groups) as Obj[];
    broken[0].rules[0].expr = broken[0].rules[0].expr.replace('== 0', '== 1');
    fs.writeFileSync(path.join(dir, 'rules.yaml'), stringify({ groups: broken }));
    assert.is.not(promtool(['test', 'rules', 'rules-test.yaml'], dir).code, 0, 'a changed rule fails its test');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

/** Grafana's variables in a query, replaced by values PromQL parses (an unknown one is an error). */
function withVariables(expr: string): string {
  const values: Record<string, string> = { node: '.*', __rate_interval: '5m', __interval: '1m', __range: '1h' };
  return expr.replace(/\$\{?(\w+)\}?/g, (_m, v: string) => {
    if (!(v in values)) throw new Error(`unknown dashboard variable $${v} in ${expr}`);
    return values[v];
  });
}

function dashboardExprs(d: Obj): Array<{ panel: string; expr: string }> {
  return (d.panels as Obj[]).filter((p) => p.type !== 'row').flatMap((p) => (p.targets ?? []).map((t: Obj) => ({ panel: p.title, expr: t.expr as string })));
}

test('every panel of the dashboard has a query, and every query parses (promtool check rules, each as a recording rule)', () => {
  const panels = (dashboard.panels as Obj[]).filter((p) => p.type !== 'row');
  assert.ok(panels.length >= 10);
  for (const p of panels) assert.ok((p.targets ?? []).length > 0 && p.targets.every((t: Obj) => typeof t.expr === 'string' && t.expr.trim()), `panel ${p.title}: a query`);
  const exprs = dashboardExprs(dashboard);
  const ids = new Set(panels.map((p) => p.id));
  assert.is(ids.size, panels.length, 'panel ids are unique');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-dash-'));
  try {
    const file = (list: Array<{ expr: string }>) => stringify({ groups: [{ name: 'dashboard', rules: list.map((e, i) => ({ record: `dashboard:query_${i}`, expr: withVariables(e.expr) })) }] });
    fs.writeFileSync(path.join(dir, 'dashboard.yaml'), file(exprs));
    const r = promtool(['check', 'rules', 'dashboard.yaml'], dir);
    assert.is(r.code, 0, r.out);
    assert.match(r.out, new RegExp(`SUCCESS: ${exprs.length} rules found`));
    // A query that does not parse fails the same check.
    fs.writeFileSync(path.join(dir, 'dashboard.yaml'), file([...exprs, { expr: 'sum by (node (tether_leader)' }]));
    assert.is.not(promtool(['check', 'rules', 'dashboard.yaml'], dir).code, 0);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('every metric the rules and the dashboard read is one tetherd exports', () => {
  const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
  const exported = new Set<string>();
  for (const m of new TetherMetrics(quiet).registry.getMetricsAsArray()) {
    exported.add(m.name);
    if (String(m.type) === 'histogram') for (const s of ['_bucket', '_sum', '_count']) exported.add(`${m.name}${s}`);
  }
  const read = [
    ...ruleObj.spec.groups.flatMap((g: Obj) => g.rules.map((r: Obj) => r.expr as string)),
    ...dashboardExprs(dashboard).map((e) => e.expr),
    ...(dashboard.templating.list as Obj[]).map((v) => v.definition ?? ''),
  ];
  const names = new Set(read.flatMap((e) => e.match(/\b(?:tether|process)_[a-z0-9_]+\b/g) ?? []));
  assert.ok(names.size > 20);
  const unknown = [...names].filter((n) => !exported.has(n));
  assert.equal(unknown, [], 'metrics read but not exported');
});

test.run();
