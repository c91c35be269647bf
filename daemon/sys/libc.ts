// The few libc calls Tether needs that Node does not offer: raw sockets (netlink), setns, and errno.
// Every wrapper throws a SysError naming the call and errno instead of returning -1.
import * as os from 'node:os';
import { koffi } from './ffi';

export class SysError extends Error {
  readonly errno: number;
  readonly syscall: string;
  readonly code: string;
  constructor(syscall: string, errno: number, what?: string) {
    const name = errnoName(errno);
    super(`${syscall}${what ? ` (${what})` : ''} failed: ${name} (errno ${errno})`);
    this.name = 'SysError';
    this.errno = errno;
    this.syscall = syscall;
    this.code = name;
  }
}

export function errnoName(errno: number): string {
  for (const [name, value] of Object.entries(os.constants.errno)) if (value === errno) return name;
  return `E${errno}`;
}

export const AF_NETLINK = 16;
export const SOCK_RAW = 3;
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = 0o2000000;
export const SOL_SOCKET = 1;
export const SO_RCVBUF = 8;
export const SO_SNDBUF = 7;
export const SO_RCVTIMEO = 20;
export const SOL_NETLINK = 270;
export const NETLINK_EXT_ACK = 11;
export const NETLINK_GET_STRICT_CHK = 12;
export const CLONE_NEWNET = 0x40000000;
export const MSG_DONTWAIT = 0x40;

interface Libc {
  socket: (domain: number, type: number, proto: number) => number;
  bind: (fd: number, addr: Buffer, len: number) => number;
  sendto: (fd: number, buf: Buffer, len: number, flags: number, addr: Buffer | null, alen: number) => number;
  recv: (fd: number, buf: Buffer, len: number, flags: number) => number;
  setsockopt: (fd: number, level: number, name: number, val: Buffer, len: number) => number;
  close: ((fd: number) => number) & { async: (fd: number, done: (err: unknown, rc: number) => void) => void };
  setns: (fd: number, nstype: number) => number;
}

let libc: Libc | undefined;

function lib(): Libc {
  if (!libc) {
    const k = koffi();
    const c = k.load('libc.so.6');
    libc = {
      socket: c.func('int socket(int, int, int)'),
      bind: c.func('int bind(int, const void *, uint32_t)'),
      sendto: c.func('intptr_t sendto(int, const void *, size_t, int, const void *, uint32_t)'),
      recv: c.func('intptr_t recv(int, _Out_ void *, size_t, int)'),
      setsockopt: c.func('int setsockopt(int, int, int, const void *, uint32_t)'),
      close: c.func('int close(int)'),
      setns: c.func('int setns(int, int)'),
    };
  }
  return libc;
}

function errno(): number {
  return koffi().errno();
}

function check(ret: number, syscall: string, what?: string): number {
  if (ret < 0) throw new SysError(syscall, errno(), what);
  return ret;
}

export function socket(domain: number, type: number, proto: number): number {
  return check(lib().socket(domain, type, proto), 'socket');
}

export function bind(fd: number, addr: Buffer): void {
  check(lib().bind(fd, addr, addr.length), 'bind');
}

export function sendto(fd: number, buf: Buffer, addr: Buffer | null): number {
  for (;;) {
    const n = lib().sendto(fd, buf, buf.length, 0, addr, addr ? addr.length : 0);
    if (n >= 0) return n;
    const e = errno();
    if (e !== os.constants.errno.EINTR) throw new SysError('sendto', e);
  }
}

/** Receives one datagram; returns its length, or -1 on EAGAIN (timeout / nothing waiting). */
export function recv(fd: number, buf: Buffer, flags = 0): number {
  for (;;) {
    const n = lib().recv(fd, buf, buf.length, flags);
    if (n >= 0) return n;
    const e = errno();
    if (e === os.constants.errno.EINTR) continue;
    if (e === os.constants.errno.EAGAIN) return -1;
    throw new SysError('recv', e);
  }
}

export function setsockoptInt(fd: number, level: number, name: number, value: number): void {
  const b = Buffer.alloc(4);
  b.writeInt32LE(value);
  check(lib().setsockopt(fd, level, name, b, 4), 'setsockopt', `level ${level} opt ${name}`);
}

export function setRecvTimeout(fd: number, ms: number): void {
  const tv = Buffer.alloc(16);
  tv.writeBigInt64LE(BigInt(Math.floor(ms / 1000)), 0);
  tv.writeBigInt64LE(BigInt((ms % 1000) * 1000), 8);
  check(lib().setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, tv, 16), 'setsockopt', 'SO_RCVTIMEO');
}

export function close(fd: number): void {
  lib().close(fd);
}

/**
 * Closes fd on a worker thread. Closing a packet socket waits for an RCU grace period in the kernel
 * (packet_release: synchronize_net), measured at 8-15 ms here: the event loop must not wait for that.
 * Only for an fd nothing uses any more; a failure is ignored as close()'s is.
 */
export function closeInBackground(fd: number): void {
  lib().close.async(fd, () => undefined);
}

export function setns(fd: number, nstype: number, what?: string): void {
  check(lib().setns(fd, nstype), 'setns', what);
}
