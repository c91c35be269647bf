// Attaching eBPF programs to the clsact hooks of an interface in any network namespace, through libbpf's
// bpf_tc_* (netlink sockets opened per call, so running them inside inNetns targets that namespace).
// A filter is identified by (interface, direction, handle, priority): enough to detach it after a
// restart without the fds that attached it.
import { koffi } from '../sys/ffi';
import { inNetns } from '../sys/netns';
import { BpfCallError, capturing, check, libbpf, quietly } from './libbpf';
import { log } from '../../lib/log';

export type TcDirection = 'ingress' | 'egress';

// enum bpf_tc_attach_point (libbpf.h)
const BPF_TC_INGRESS = 1;
const BPF_TC_EGRESS = 2;
const BPF_TC_F_REPLACE = 1;

const ENOENT = 2;
const EEXIST = 17;
const EINVAL = 22;

export interface TcTarget {
  /** Network namespace path (/run/netns/x, /proc/PID/ns/net); null or absent: the caller's own. */
  netns?: string | null;
  ifName?: string;
  ifindex?: number;
  direction: TcDirection;
}

export interface TcFilterId extends TcTarget {
  handle: number;
  priority: number;
}

export interface TcAttachOptions extends TcTarget {
  progFd: number;
  /** Filter handle and priority; 0/absent lets the kernel choose (then read them from the result). */
  handle?: number;
  priority?: number;
  /** Replace a filter already at (handle, priority) instead of failing with EEXIST; default true. */
  replace?: boolean;
}

export interface TcAttachment {
  netns: string | null;
  ifindex: number;
  direction: TcDirection;
  handle: number;
  priority: number;
  progId: number;
}

let nameToIndex: ((name: string) => number) | undefined;

/** if_nametoindex in the calling thread's namespace (it opens a socket there); 0 when absent. */
function ifIndexHere(name: string): number {
  if (!nameToIndex) nameToIndex = koffi().load('libc.so.6').func('unsigned int if_nametoindex(const char *name)');
  return nameToIndex!(name);
}

function describe(t: TcTarget): string {
  return `${t.ifName ?? `ifindex ${t.ifindex}`} ${t.direction}${t.netns ? ` in ${t.netns}` : ''}`;
}

function resolveIfindex(t: TcTarget): number {
  if (t.ifindex) return t.ifindex;
  if (!t.ifName) throw new BpfCallError('resolve interface', 'neither ifName nor ifindex given', EINVAL);
  return ifIndexHere(t.ifName);
}

/** struct bpf_tc_hook { size_t sz; int ifindex; enum bpf_tc_attach_point attach_point; __u32 parent; size_t :0; } */
function hookBuf(ifindex: number, attachPoint: number): Buffer {
  const b = Buffer.alloc(24);
  b.writeBigUInt64LE(24n, 0);
  b.writeInt32LE(ifindex, 8);
  b.writeUInt32LE(attachPoint, 12);
  return b;
}

/** struct bpf_tc_opts { size_t sz; int prog_fd; __u32 flags; __u32 prog_id; __u32 handle; __u32 priority; size_t :0; } */
function optsBuf(o: { progFd?: number; flags?: number; progId?: number; handle?: number; priority?: number }): Buffer {
  const b = Buffer.alloc(32);
  b.writeBigUInt64LE(32n, 0);
  b.writeInt32LE(o.progFd ?? 0, 8);
  b.writeUInt32LE(o.flags ?? 0, 12);
  b.writeUInt32LE(o.progId ?? 0, 16);
  b.writeUInt32LE(o.handle ?? 0, 20);
  b.writeUInt32LE(o.priority ?? 0, 24);
  return b;
}

function attachPoint(d: TcDirection): number {
  return d === 'ingress' ? BPF_TC_INGRESS : BPF_TC_EGRESS;
}

function here<T>(netns: string | null | undefined, fn: () => T): T {
  return netns ? inNetns(netns, fn) : fn();
}

/**
 * Creates the clsact qdisc unless it exists (idempotent). Must run in the target namespace. libbpf asks
 * for the qdisc with NLM_F_EXCL, so on an interface that has one (every re-attach, every restart) the
 * kernel answers EEXIST with the extack "Exclusivity flag on, cannot modify", which libbpf prints as a
 * warning: that answer is the expected one and its text is dropped; any other failure carries it.
 */
function ensureClsactHere(ifindex: number, what: string): void {
  const { value: ret, warnings } = capturing(() => libbpf().bpf_tc_hook_create(hookBuf(ifindex, BPF_TC_INGRESS)));
  if (ret === -EEXIST) return;
  if (ret < 0) throw new BpfCallError('bpf_tc_hook_create', warnings.length ? `${what}; ${warnings.join('; ')}` : what, -ret);
  for (const w of warnings) log().warn(w);
}

/** Creates the clsact qdisc on the interface unless it exists (idempotent). */
export function ensureClsact(t: Omit<TcTarget, 'direction'>): void {
  const target = { ...t, direction: 'ingress' as const };
  here(t.netns, () => ensureClsactHere(requireIfindex(target), `clsact on ${describe(target)}`));
}

function requireIfindex(t: TcTarget): number {
  const ifindex = resolveIfindex(t);
  if (!ifindex) throw new BpfCallError('if_nametoindex', `interface ${describe(t)}`, ENOENT);
  return ifindex;
}

/**
 * Attaches progFd as a direct-action filter on the interface's clsact hook, creating clsact if needed.
 * With replace (the default) a filter already at (handle, priority) gets the new program in place: the
 * kernel swaps the program of that one filter under RCU, so every packet meets either the old program or
 * the new one and none passes unprocessed, which detaching first and attaching again could not promise.
 */
export function attachTc(o: TcAttachOptions): TcAttachment {
  const what = `tc ${describe(o)}`;
  return here(o.netns, () => {
    const ifindex = requireIfindex(o);
    ensureClsactHere(ifindex, what);
    const opts = optsBuf({ progFd: o.progFd, handle: o.handle, priority: o.priority, flags: o.replace === false ? 0 : BPF_TC_F_REPLACE });
    check(libbpf().bpf_tc_attach(hookBuf(ifindex, attachPoint(o.direction)), opts), 'bpf_tc_attach', what);
    return {
      netns: o.netns ?? null,
      ifindex,
      direction: o.direction,
      progId: opts.readUInt32LE(16),
      handle: opts.readUInt32LE(20),
      priority: opts.readUInt32LE(24),
    };
  });
}

/** The id of the program at (handle, priority), or undefined when no such filter (or interface) exists. */
export function queryTc(f: TcFilterId): number | undefined {
  return here(f.netns, () => {
    const ifindex = resolveIfindex(f);
    if (!ifindex) return undefined;
    const opts = optsBuf({ handle: f.handle, priority: f.priority });
    const ret = quietly(() => libbpf().bpf_tc_query(hookBuf(ifindex, attachPoint(f.direction)), opts));
    // No filter there, and no clsact qdisc at all, both mean "nothing attached".
    if (ret === -ENOENT || ret === -EINVAL) return undefined;
    check(ret, 'bpf_tc_query', `tc ${describe(f)} handle ${f.handle} priority ${f.priority}`);
    return opts.readUInt32LE(16);
  });
}

/** Removes the filter at (handle, priority). Idempotent: false when it, its qdisc or the interface is gone. */
export function detachTc(f: TcFilterId): boolean {
  const what = `tc ${describe(f)} handle ${f.handle} priority ${f.priority}`;
  return here(f.netns, () => {
    const ifindex = resolveIfindex(f);
    if (!ifindex) return false;
    const hook = hookBuf(ifindex, attachPoint(f.direction));
    // Query first: detach answers a missing qdisc with EINVAL, which must not hide real EINVALs.
    const q = quietly(() => libbpf().bpf_tc_query(hook, optsBuf({ handle: f.handle, priority: f.priority })));
    if (q === -ENOENT || q === -EINVAL) return false;
    const ret = libbpf().bpf_tc_detach(hook, optsBuf({ handle: f.handle, priority: f.priority }));
    if (ret === -ENOENT) return false;
    check(ret, 'bpf_tc_detach', what);
    return true;
  });
}

/** Deletes the clsact qdisc and with it every filter on both hooks. Idempotent. */
export function destroyClsact(t: Omit<TcTarget, 'direction'>): void {
  const target = { ...t, direction: 'ingress' as const };
  here(t.netns, () => {
    const ifindex = resolveIfindex(target);
    if (!ifindex) return;
    const ret = quietly(() => libbpf().bpf_tc_hook_destroy(hookBuf(ifindex, BPF_TC_INGRESS | BPF_TC_EGRESS)));
    if (ret !== -ENOENT && ret !== -EINVAL) check(ret, 'bpf_tc_hook_destroy', `clsact on ${describe(target)}`);
  });
}
