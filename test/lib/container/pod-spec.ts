// The DaemonSet's and the Deployment's containers as the manifests in install/ describe them, and how a runtime turns one into a
// container: what kubelet asks (capabilities, privilege, seccomp, read-only root, host namespaces, volumes
// with their propagation) becomes the flags of containerd's own client, so the spec runc gets comes from
// containerd's code (its default spec: read-only /proc/sys and the other readonlyPaths, masked /proc paths,
// its RuntimeDefault seccomp profile computed for the container's capabilities).
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';

type Obj = Record<string, any>;

export interface VolumeMount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
  mountPropagation?: 'None' | 'HostToContainer' | 'Bidirectional';
}

export interface HttpProbe {
  httpGet: { port: number; path: string };
  periodSeconds?: number;
  failureThreshold?: number;
  timeoutSeconds?: number;
}

export interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { fieldRef?: { fieldPath: string }; configMapKeyRef?: { name: string; key: string } };
}

export interface ContainerSpec {
  name: string;
  command: string[];
  env?: EnvVar[];
  startupProbe?: HttpProbe;
  readinessProbe?: HttpProbe;
  livenessProbe?: HttpProbe;
  securityContext?: {
    runAsUser?: number;
    runAsGroup?: number;
    runAsNonRoot?: boolean;
    privileged?: boolean;
    allowPrivilegeEscalation?: boolean;
    readOnlyRootFilesystem?: boolean;
    seccompProfile?: { type: string };
    appArmorProfile?: { type: string };
    capabilities?: { add?: string[]; drop?: string[] };
  };
  volumeMounts?: VolumeMount[];
}

export interface PodSpec {
  hostNetwork?: boolean;
  hostPID?: boolean;
  terminationGracePeriodSeconds?: number;
  initContainers?: ContainerSpec[];
  containers: ContainerSpec[];
  volumes: Array<{ name: string; hostPath?: { path: string; type?: string }; emptyDir?: Record<string, unknown> }>;
  serviceAccountName?: string;
}

const root = path.join(__dirname, '../../..');

const rendered = new Map<string, Obj[]>();

/** Every object of a kustomization, built with kustomize exactly as `kubectl apply -k DIR` would (once per DIR). */
export function installObjects(dir = 'install'): Obj[] {
  const abs = path.resolve(root, dir);
  let objs = rendered.get(abs);
  if (!objs) {
    const out = execFileSync('kubectl', ['kustomize', abs], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    rendered.set(abs, (objs = parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean)));
  }
  return structuredClone(objs);
}

/** A workload (DaemonSet, Deployment) of a kustomization by kind and name. */
function workload(dir: string, kind: string, name: string): Obj {
  const w = installObjects(dir).find((o) => o.kind === kind && o.metadata?.name === name);
  if (!w) throw new Error(`kubectl kustomize ${dir}: no ${kind} ${name}`);
  return w;
}

/** A DaemonSet's pod spec, built from a kustomization with kustomize exactly as `kubectl apply -k DIR` would. */
export function daemonSetPodSpec(dir: string, name: string): PodSpec {
  return workload(dir, 'DaemonSet', name).spec.template.spec as PodSpec;
}

/** The tetherd DaemonSet's pod spec (`kubectl apply -k install/`), of this tree or of another release's. */
export function tetherdPodSpec(tree = root): PodSpec {
  return daemonSetPodSpec(path.join(tree, 'install'), 'tetherd');
}

/** The tether-operator Deployment of `kubectl apply -k install/`: its replicas and its pod spec. */
export function operatorDeployment(tree = root): { replicas: number; pod: PodSpec } {
  const d = workload(path.join(tree, 'install'), 'Deployment', 'tether-operator');
  return { replicas: d.spec.replicas ?? 1, pod: d.spec.template.spec as PodSpec };
}

/**
 * A container's environment as kubelet gives it: literal values, and the downward API and ConfigMap keys
 * from `sources` ("metadata.name", "configmap/<name without kustomize's hash>/<key>"); a source it does not
 * have is an error.
 */
export function containerEnv(c: ContainerSpec, sources: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of c.env ?? []) {
    if (e.value !== undefined) continue; // ctrRunFlags passes literal values
    const cm = e.valueFrom?.configMapKeyRef;
    // A generated ConfigMap's name carries kustomize's content hash: the source is named without it.
    const from = e.valueFrom?.fieldRef ? e.valueFrom.fieldRef.fieldPath : cm ? `configmap/${cm.name.replace(/-[a-z0-9]{10}$/, '')}/${cm.key}` : undefined;
    const v = from === undefined ? undefined : sources[from];
    if (v === undefined) throw new Error(`${c.name}: env ${e.name} comes from ${from ?? JSON.stringify(e.valueFrom)}, which the runtime here does not provide`);
    env[e.name] = v;
  }
  return env;
}

/** kubelet's $(VAR) expansion of a command from the container's environment ($$ escapes; unknown names stay). */
export function expandCommand(argv: string[], env: Record<string, string>): string[] {
  return argv.map((a) => a.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name?: string) => (name === undefined ? '$' : env[name] ?? m)));
}

export function containerOf(pod: PodSpec, name: string): ContainerSpec {
  const c = [...(pod.initContainers ?? []), ...pod.containers].find((x) => x.name === name);
  if (!c) throw new Error(`the DaemonSet has no container ${name}`);
  return c;
}

/** The capabilities an OCI runtime grants a container by default (containerd's default spec, `ctr oci spec`). */
export const RUNTIME_DEFAULT_CAPS = [
  'CHOWN', 'DAC_OVERRIDE', 'FSETID', 'FOWNER', 'MKNOD', 'NET_RAW', 'SETGID', 'SETUID', 'SETFCAP', 'SETPCAP', 'NET_BIND_SERVICE', 'SYS_CHROOT', 'KILL', 'AUDIT_WRITE',
];

/** Kubernetes' capability arithmetic: drop (ALL or names) from the runtime's defaults, then add. */
export function effectiveCaps(c: ContainerSpec): string[] {
  const caps = c.securityContext?.capabilities ?? {};
  const drop = caps.drop ?? [];
  const base = drop.includes('ALL') ? [] : RUNTIME_DEFAULT_CAPS.filter((x) => !drop.includes(x));
  return [...new Set([...base, ...(caps.add ?? [])])].sort();
}

export interface CtrRunInput {
  pod: PodSpec;
  container: ContainerSpec;
  /** Where each hostPath volume's path is on this machine (the testbed gives every node its own dirs). */
  hostPath: (volume: string, manifestPath: string) => string;
  /** The network namespace that stands for the node's (hostNetwork). */
  nodeNetns: string;
  /** A pod without hostNetwork: the network namespace made for it (the testbed's stand-in for a pod network). */
  podNetns?: string;
  /** A pod's emptyDir volume: a fresh directory on this machine. */
  emptyDir?: (volume: string) => string;
  /** argv replacing the manifest's command (kubelet substitutes env and flags; the testbed its own). */
  argv: string[];
  env: Record<string, string>;
  /** Test-only binds (config files, the store's socket dir) at the same path, read-only: not the manifest's. */
  extraReadOnlyDirs?: string[];
}

const PROPAGATION: Record<string, string> = { None: 'rprivate', HostToContainer: 'rslave', Bidirectional: 'rshared' };

/** The flags of `ctr run` that give a container what kubelet would ask of the runtime for this spec. */
export function ctrRunFlags(i: CtrRunInput): string[] {
  const sc = i.container.securityContext ?? {};
  const flags: string[] = [];
  if (i.pod.hostPID) throw new Error('hostPID is not modelled: the manifest was meant to drop it');
  if (!i.pod.hostNetwork && !i.podNetns) throw new Error(`${i.container.name}: a pod without hostNetwork needs a network namespace of its own (podNetns)`);
  flags.push('--with-ns', `network:${i.pod.hostNetwork ? i.nodeNetns : i.podNetns}`);
  const user = runAs(i.container);
  if (sc.privileged) {
    flags.push('--privileged');
  } else {
    // A non-root container gets, for its uid switch only, the capabilities runAsArgv gives up in it.
    const want = user ? [...new Set([...effectiveCaps(i.container), ...SWITCH_CAPS])] : effectiveCaps(i.container);
    for (const c of RUNTIME_DEFAULT_CAPS) if (!want.includes(c)) flags.push('--cap-drop', `CAP_${c}`);
    for (const c of want) if (!RUNTIME_DEFAULT_CAPS.includes(c)) flags.push('--cap-add', `CAP_${c}`);
    // RuntimeDefault (or kubelet's --seccomp-default for an unset profile): containerd's profile for these caps.
    if (!sc.seccompProfile || sc.seccompProfile.type === 'RuntimeDefault') flags.push('--seccomp');
    else if (sc.seccompProfile.type !== 'Unconfined') throw new Error(`seccompProfile ${sc.seccompProfile.type} is not modelled`);
  }
  // allowPrivilegeEscalation: false is no_new_privs, ctr's default; true, unset or privileged turn it off.
  if (sc.allowPrivilegeEscalation !== false) flags.push('--allow-new-privs');
  if (sc.readOnlyRootFilesystem) flags.push('--read-only');
  const mounts = i.container.volumeMounts ?? [];
  let rootProp = 'rprivate';
  for (const m of mounts) {
    const vol = i.pod.volumes.find((v) => v.name === m.name);
    if (!vol?.hostPath && !(vol?.emptyDir && i.emptyDir)) throw new Error(`volume ${m.name}: only hostPath volumes (and emptyDir, given a directory for it) are modelled`);
    const src = vol.hostPath ? i.hostPath(m.name, vol.hostPath.path) : i.emptyDir!(m.name);
    const prop = PROPAGATION[m.mountPropagation ?? 'None'];
    if (m.mountPropagation === 'Bidirectional' && !sc.privileged) throw new Error(`${i.container.name}: Bidirectional propagation needs a privileged container (as the API server enforces)`);
    // As containerd's CRI: a slave or shared mount needs the container's root to propagate as much.
    if (prop === 'rshared') rootProp = 'rshared';
    else if (prop === 'rslave' && rootProp === 'rprivate') rootProp = 'rslave';
    flags.push('--mount', `type=bind,src=${src},dst=${m.mountPath},options=rbind:${m.readOnly ? 'ro' : 'rw'}:${prop}`);
  }
  for (const d of i.extraReadOnlyDirs ?? []) flags.push('--mount', `type=bind,src=${d},dst=${d},options=rbind:ro:rprivate`);
  if (rootProp !== 'rprivate') flags.push('--rootfs-propagation', rootProp);
  for (const e of i.container.env ?? []) if (e.value !== undefined) flags.push('--env', `${e.name}=${e.value}`);
  for (const [k, v] of Object.entries(i.env)) flags.push('--env', `${k}=${v}`);
  return flags;
}

/** Capabilities the uid switch needs for a moment (changing uid and gid, emptying the bounding set). */
const SWITCH_CAPS = ['SETUID', 'SETGID', 'SETPCAP'];

/** The uid:gid a container runs as (securityContext runAsUser/runAsGroup), undefined for root; runAsNonRoot checked as kubelet does. */
function runAs(c: ContainerSpec): { uid: number; gid: number } | undefined {
  const sc = c.securityContext ?? {};
  if (sc.runAsNonRoot && !sc.runAsUser) throw new Error(`${c.name}: runAsNonRoot without a non-zero runAsUser (kubelet refuses an image user it cannot verify)`);
  if (!sc.runAsUser) return undefined;
  return { uid: sc.runAsUser, gid: sc.runAsGroup ?? 0 };
}

/**
 * The container's argv as its user runs it. containerd 1.6's `ctr run` has no --user: setpriv (util-linux,
 * in the image) switches to runAsUser/runAsGroup with no supplementary groups, after emptying the bounding
 * and inheritable sets; a process changing from uid 0 to another keeps no permitted or effective capability,
 * so what runs has the manifest's capabilities (none with drop ALL) and no_new_privs, as under kubelet.
 */
export function runAsArgv(c: ContainerSpec, argv: string[]): string[] {
  const user = runAs(c);
  if (!user) return argv;
  if (c.securityContext?.privileged || effectiveCaps(c).length) throw new Error(`${c.name}: a non-root container with capabilities is not modelled`);
  return ['/usr/bin/setpriv', `--reuid=${user.uid}`, `--regid=${user.gid}`, '--clear-groups', '--bounding-set=-all', '--inh-caps=-all', '--', ...argv];
}
