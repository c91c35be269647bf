// The DaemonSet's containers as the manifest in install/ describes them, and how a runtime turns one into a
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

export interface ContainerSpec {
  name: string;
  command: string[];
  env?: Array<{ name: string; value?: string; valueFrom?: unknown }>;
  securityContext?: {
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
  volumes: Array<{ name: string; hostPath?: { path: string; type?: string } }>;
}

const root = path.join(__dirname, '../../..');

/** A DaemonSet's pod spec, built from a kustomization with kustomize exactly as `kubectl apply -k DIR` would. */
export function daemonSetPodSpec(dir: string, name: string): PodSpec {
  const out = execFileSync('kubectl', ['kustomize', path.resolve(root, dir)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const ds = parseAllDocuments(out)
    .map((d) => d.toJS() as Obj)
    .find((o) => o?.kind === 'DaemonSet' && o.metadata?.name === name);
  if (!ds) throw new Error(`kubectl kustomize ${dir}: no DaemonSet ${name}`);
  return ds.spec.template.spec as PodSpec;
}

/** The tetherd DaemonSet's pod spec (`kubectl apply -k install/`), of this tree or of another release's. */
export function tetherdPodSpec(tree = root): PodSpec {
  return daemonSetPodSpec(path.join(tree, 'install'), 'tetherd');
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
  if (!i.pod.hostNetwork) throw new Error('tetherd runs with hostNetwork: the harness only models that');
  flags.push('--with-ns', `network:${i.nodeNetns}`);
  if (sc.privileged) {
    flags.push('--privileged');
  } else {
    const want = effectiveCaps(i.container);
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
    if (!vol?.hostPath) throw new Error(`volume ${m.name}: only hostPath volumes are modelled`);
    const src = i.hostPath(m.name, vol.hostPath.path);
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
