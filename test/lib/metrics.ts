// Reading tetherd's /metrics in tests: the Prometheus text exposition format (0.0.4) parsed into families
// and samples, the naming rules checked, and the samples a `tetherctl status` answer implies, to compare
// a scrape with the status the same tetherd reports. Hand-written: the npm parser available
// (parse-prometheus-text-format 1.1.1) folds a histogram's labelled series into one and drops their
// _sum and _count, and tetherd's CNI histogram is labelled.

export interface Sample {
  /** The sample's own name: a histogram's are name_bucket, name_sum, name_count. */
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface MetricFamily {
  name: string;
  help?: string;
  type?: string;
  samples: Sample[];
}

export interface Scrape {
  families: Map<string, MetricFamily>;
  /** The value of the sample `name` whose labels include `labels` (exactly one must match), or undefined. */
  value(name: string, labels?: Record<string, string>): number | undefined;
  /** Every sample named `name` whose labels include `labels`. */
  samples(name: string, labels?: Record<string, string>): Sample[];
}

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_RE = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const SUFFIXES: Record<string, string[]> = { histogram: ['_bucket', '_sum', '_count'], summary: ['_sum', '_count'] };

/** A sample value as Prometheus reads it (Go's ParseFloat: NaN and Inf in any case; prom-client writes "Nan"). */
function parseValue(raw: string, line: number): number {
  const l = raw.toLowerCase();
  if (l === '+inf' || l === 'inf') return Infinity;
  if (l === '-inf') return -Infinity;
  if (l === 'nan') return NaN;
  const v = Number(raw);
  if (raw === '' || Number.isNaN(v)) throw new Error(`line ${line}: ${JSON.stringify(raw)} is not a sample value`);
  return v;
}

function unescape(s: string, quote: boolean): string {
  return s.replace(quote ? /\\(["\\n])/g : /\\([\\n])/g, (_m, c: string) => (c === 'n' ? '\n' : c));
}

/** The labels of `{…}` from position `i` of `text` (just after the brace); returns them and the position after `}`. */
function parseLabels(text: string, i: number, line: number): { labels: Record<string, string>; end: number } {
  const labels: Record<string, string> = {};
  const bad = (why: string) => new Error(`line ${line}: ${why}: ${text}`);
  for (;;) {
    while (text[i] === ' ') i++;
    if (text[i] === '}') return { labels, end: i + 1 };
    const eq = text.indexOf('=', i);
    if (eq < 0) throw bad('label without =');
    const name = text.slice(i, eq).trim();
    if (!LABEL_RE.test(name)) throw bad(`label name ${JSON.stringify(name)}`);
    if (text[eq + 1] !== '"') throw bad('label value not quoted');
    let j = eq + 2;
    let raw = '';
    while (j < text.length && text[j] !== '"') {
      if (text[j] === '\\') raw += text[j++];
      raw += text[j++];
    }
    if (j >= text.length) throw bad('label value not closed');
    if (name in labels) throw bad(`label ${name} twice`);
    labels[name] = unescape(raw, true);
    i = j + 1;
    while (text[i] === ' ') i++;
    if (text[i] === ',') i++;
    else if (text[i] !== '}') throw bad('expected , or }');
  }
}

/** Parses the text format; throws naming the line on anything malformed. */
export function parseExposition(text: string): Scrape {
  const families = new Map<string, MetricFamily>();
  const family = (name: string) => {
    let f = families.get(name);
    if (!f) families.set(name, (f = { name, samples: [] }));
    return f;
  };
  /** Which family a sample name belongs to: its own, or the histogram/summary it is a suffix of. */
  const owner = (name: string): MetricFamily => {
    for (const f of families.values()) {
      if (f.name === name) return f;
      for (const sfx of SUFFIXES[f.type ?? ''] ?? []) if (name === f.name + sfx) return f;
    }
    return family(name);
  };
  text.split('\n').forEach((raw, k) => {
    const line = k + 1;
    const l = raw.trim();
    if (!l) return;
    const meta = /^#\s*(HELP|TYPE)\s+(\S+)(?:\s(.*))?$/.exec(l);
    if (meta) {
      const [, kind, name, rest = ''] = meta;
      if (!NAME_RE.test(name)) throw new Error(`line ${line}: metric name ${JSON.stringify(name)}`);
      const f = family(name);
      if (kind === 'HELP') {
        if (f.help !== undefined) throw new Error(`line ${line}: second HELP for ${name}`);
        f.help = unescape(rest, false);
      } else {
        if (f.type !== undefined) throw new Error(`line ${line}: second TYPE for ${name}`);
        if (f.samples.length) throw new Error(`line ${line}: TYPE for ${name} after its samples`);
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest)) throw new Error(`line ${line}: type ${JSON.stringify(rest)}`);
        f.type = rest;
      }
      return;
    }
    if (l.startsWith('#')) return;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(l);
    if (!m) throw new Error(`line ${line}: not a sample: ${l}`);
    const name = m[1];
    let i = name.length;
    let labels: Record<string, string> = {};
    if (l[i] === '{') ({ labels, end: i } = parseLabels(l, i + 1, line));
    const fields = l.slice(i).trim().split(/\s+/);
    if (fields.length < 1 || fields.length > 2) throw new Error(`line ${line}: expected a value and an optional timestamp: ${l}`);
    owner(name).samples.push({ name, labels, value: parseValue(fields[0], line) });
  });
  const matches = (s: Sample, want: Record<string, string>) => Object.entries(want).every(([k, v]) => s.labels[k] === v);
  const samples = (name: string, labels: Record<string, string> = {}) => [...families.values()].flatMap((f) => f.samples).filter((s) => s.name === name && matches(s, labels));
  return {
    families,
    samples,
    value(name, labels = {}) {
      const found = samples(name, labels);
      if (found.length > 1) throw new Error(`${name}${JSON.stringify(labels)}: ${found.length} samples match`);
      return found[0]?.value;
    },
  };
}

/** GETs a /metrics URL and parses it; throws on a status other than 200. */
export async function scrapeMetrics(url: string): Promise<Scrape & { contentType: string | null; text: string }> {
  const res = await fetch(url);
  const text = await res.text();
  if (res.status !== 200) throw new Error(`GET ${url}: ${res.status} ${text.slice(0, 200)}`);
  return { ...parseExposition(text), contentType: res.headers.get('content-type'), text };
}

/** Labels that would make a series per pod, flow or client (unbounded): none may appear. */
const UNBOUNDED_LABELS = ['pod', 'pod_ip', 'ip', 'client', 'client_ip', 'src', 'dst', 'flow', 'port', 'container_id'];

/**
 * What breaks Prometheus's naming rules in a scrape: a family without HELP or TYPE, a counter not ending
 * in _total (or another type that does), a name that is not tether_ (bar prom-client's process_ and
 * nodejs_ ones), a unit not in base units, a label name that is invalid or unbounded.
 */
export function namingProblems(s: Scrape): string[] {
  const out: string[] = [];
  for (const f of s.families.values()) {
    if (f.help === undefined || f.help === '') out.push(`${f.name}: no HELP`);
    if (f.type === undefined) out.push(`${f.name}: no TYPE`);
    if (!/^(tether|process|nodejs)_/.test(f.name)) out.push(`${f.name}: neither tether_ nor process_/nodejs_`);
    // prom-client's own process_ and nodejs_ names are kept as every Node exporter has them (some are
    // gauges ending in _total: nodejs_active_handles_total); the rules below are tether_'s.
    if (!f.name.startsWith('tether_')) continue;
    if (f.type === 'counter' && !f.name.endsWith('_total')) out.push(`${f.name}: a counter not ending in _total`);
    if (f.type !== 'counter' && f.name.endsWith('_total')) out.push(`${f.name}: a ${f.type} ending in _total`);
    if (/_(ms|milliseconds|microseconds|us|kb|kilobytes|mb|megabytes|percent)(_|$)/.test(f.name)) out.push(`${f.name}: a unit that is not a base unit (seconds, bytes, ratio)`);
    if (f.name.startsWith('tether_') && f.name.endsWith('_seconds') && f.type === 'counter') out.push(`${f.name}: a counter of seconds must end in _seconds_total`);
    for (const x of f.samples) {
      for (const k of Object.keys(x.labels)) {
        if (!LABEL_RE.test(k) || k.startsWith('__')) out.push(`${f.name}: label name ${k}`);
        if (UNBOUNDED_LABELS.includes(k)) out.push(`${f.name}: label ${k} is unbounded (per pod, flow or client)`);
      }
    }
  }
  return [...new Set(out)];
}

type Json = Record<string, any>;

/** A sample the status implies: gauges equal the status; counters are at least its value when scraped after it. */
export interface Expected {
  name: string;
  labels: Record<string, string>;
  value: number;
  kind: 'gauge' | 'counter';
}

/**
 * The samples a `tetherctl status` answer implies (what tetherd's metrics read: the same status, so every
 * one must be in a scrape of the same tetherd). The comparison in compareWithStatus.
 */
export function expectedFromStatus(status: Json): Expected[] {
  const out: Expected[] = [];
  const g = (name: string, labels: Record<string, string>, value: unknown) => typeof value === 'number' && out.push({ name, labels, value, kind: 'gauge' });
  const c = (name: string, labels: Record<string, string>, value: unknown) => typeof value === 'number' && out.push({ name, labels, value, kind: 'counter' });
  for (const [subsystem, up] of Object.entries((status.storeReachable ?? {}) as Record<string, boolean>)) g('tether_store_reachable', { subsystem }, up ? 1 : 0);
  for (const [subsystem, x] of Object.entries((status.storeFull ?? {}) as Record<string, { full: boolean; refusals: number }>)) {
    g('tether_store_full', { subsystem }, x.full ? 1 : 0);
    c('tether_store_full_refusals_total', { subsystem }, x.refusals);
  }
  for (const p of status.ipam?.pods ?? []) {
    for (const f of p.families ?? []) {
      const l = { pool: p.pool, family: `ipv${f.family}` };
      g('tether_ipam_pod_addresses_allocated', l, f.allocated);
      g('tether_ipam_pod_addresses_capacity', l, f.allocated + f.free);
      g('tether_ipam_pod_blocks', l, f.blocks?.length);
    }
  }
  for (const p of status.ipam?.cluster ?? []) {
    g('tether_ipam_cluster_addresses_allocated', { pool: p.pool }, p.allocated);
    g('tether_ipam_cluster_addresses_capacity', { pool: p.pool }, p.capacity);
  }
  for (const a of status.egress ?? []) {
    const l = { egress: a.egress, address: a.address };
    if (a.ownerNode) g('tether_egress_address_owner_info', { ...l, owner_node: a.ownerNode }, 1);
    g('tether_egress_address_owned', l, a.ownedHere ? 1 : 0);
    g('tether_egress_address_epoch', l, a.epoch);
    c('tether_egress_address_flows_total', l, a.flows);
    c('tether_egress_address_packets_total', l, a.packets);
    c('tether_egress_address_bytes_total', l, a.bytes);
    for (const [cause, n] of Object.entries(a.takeovers ?? {})) c('tether_egress_address_takeovers_total', { ...l, cause }, n);
    for (const x of a.sync ?? []) {
      if (x.peer !== undefined) {
        c('tether_conntrack_sync_sent_entries_total', { ...l, peer: x.peer }, x.entriesSent);
        c('tether_conntrack_sync_sent_resyncs_total', { ...l, peer: x.peer }, x.resyncs);
      } else {
        c('tether_conntrack_sync_applied_entries_total', { ...l, peer: x.from }, x.entriesApplied);
        c('tether_conntrack_sync_received_resyncs_total', { ...l, peer: x.from }, x.resyncs);
      }
    }
  }
  // Standbys not in sync, by reason (every address whose status has standbySync says whether it is one).
  const standbyProblems: Record<string, number> = {};
  for (const a of status.egress ?? []) {
    const x = a.standbySync;
    if (x && !x.inSync && x.reason) standbyProblems[x.reason] = (standbyProblems[x.reason] ?? 0) + 1;
  }
  for (const [reason, n] of Object.entries(standbyProblems)) g('tether_egress_standby_sync_problem_addresses', { reason }, n);
  const sec = status.egressSecurity ?? {};
  for (const [reason, n] of Object.entries(sec.bfdRejected ?? {})) c('tether_bfd_rejected_packets_total', { reason }, n);
  for (const [reason, n] of Object.entries(sec.syncRejected ?? {})) c('tether_conntrack_sync_rejected_frames_total', { reason }, n);
  for (const [reason, n] of Object.entries(sec.noticesRejected ?? {})) c('tether_egress_notices_rejected_total', { reason }, n);
  for (const x of status.bfd?.sessions ?? []) {
    g('tether_bfd_session_state', { peer: x.peer, state: x.state }, 1);
    c('tether_bfd_session_transitions_total', { peer: x.peer, to: 'up' }, x.ups);
    c('tether_bfd_session_transitions_total', { peer: x.peer, to: 'down' }, x.downs);
  }
  for (const s of status.loadBalancers ?? []) {
    if (s.targets) {
      g('tether_lb_targets', { service: s.service, state: 'active' }, s.targets.active);
      g('tether_lb_targets', { service: s.service, state: 'terminating' }, s.targets.terminating);
    }
    if (!s.vip) continue;
    const l = { service: s.service, vip: s.vip };
    g('tether_lb_mappings', l, s.mappings);
    g('tether_lb_vip_announced', l, s.announced ? 1 : 0);
    g('tether_lb_store_queued_mappings', l, s.mappingStore?.queued);
    c('tether_lb_packets_total', l, s.counters?.packets);
    c('tether_lb_bytes_total', l, s.counters?.bytes);
    c('tether_lb_mapping_misses_total', l, s.counters?.misses);
    c('tether_lb_dropped_packets_total', { ...l, reason: 'noTarget' }, s.counters?.dropNoTarget);
  }
  const h = status.health;
  if (h) {
    g('tether_health_node_healthy', {}, h.healthy ? 1 : 0);
    g('tether_health_node_eligible', {}, h.nodeEligible ? 1 : 0);
    for (const a of h.answers ?? []) c('tether_health_answers_total', { check: a.check, code: String(a.code) }, a.count);
    for (const x of h.services ?? []) {
      g('tether_health_service_local_endpoints', { service: x.service }, x.localEndpoints ?? 0);
      g('tether_health_service_healthy', { service: x.service }, x.answer === 200 ? 1 : 0);
      g('tether_health_service_port_open', { service: x.service }, x.open ? 1 : 0);
    }
  }
  return out;
}

/**
 * Where a scrape disagrees with a status answer taken just before it: a gauge not equal, a counter below
 * the status's value (counters only grow between the two), a sample missing. Empty when they agree.
 */
export function compareWithStatus(status: Json, scrape: Scrape): string[] {
  const out: string[] = [];
  for (const e of expectedFromStatus(status)) {
    const exact = scrape.samples(e.name).filter((s) => Object.keys(s.labels).length === Object.keys(e.labels).length && Object.entries(e.labels).every(([k, v]) => s.labels[k] === v));
    const where = `${e.name}${JSON.stringify(e.labels)}`;
    if (exact.length !== 1) out.push(`${where}: ${exact.length} samples in the scrape, status says ${e.value}`);
    else if (e.kind === 'gauge' ? exact[0].value !== e.value : exact[0].value < e.value) out.push(`${where}: scrape ${exact[0].value}, status ${e.value}`);
  }
  return out;
}
