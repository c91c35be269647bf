// NetlinkError: a TetherError (code NETLINK) for a request the kernel refused, carrying errno, its name,
// the operation in words and the kernel's extended-ack text, e.g.
// "RTM_NEWROUTE 10.1.0.0/24 table 100: EEXIST (File exists)".
import * as os from 'node:os';
import { ErrorCode, TetherError } from '../../lib/errors';
import { errnoName } from '../sys/libc';
import { koffi } from '../sys/ffi';

let strerrorFn: ((n: number) => string) | undefined;

/** libc's message for an errno ("File exists"); the kernel's own words, so logs match `ip` output. */
export function strerror(errno: number): string {
  try {
    if (!strerrorFn) strerrorFn = koffi().load('libc.so.6').func('const char *strerror(int)') as (n: number) => string;
    return strerrorFn(errno);
  } catch {
    return `errno ${errno}`;
  }
}

// Linux aliases (ENOTSUP = EOPNOTSUPP, EWOULDBLOCK = EAGAIN): name them the way the kernel sources do.
const PREFERRED: Record<number, string> = { 95: 'EOPNOTSUPP', 11: 'EAGAIN' };

export function netlinkErrnoName(errno: number): string {
  return PREFERRED[errno] ?? errnoName(errno);
}

export class NetlinkError extends TetherError {
  readonly errno: number;
  readonly errnoName: string;
  readonly op: string;
  readonly extAck?: string;

  constructor(op: string, errno: number, extAck?: string, opts: { cause?: unknown; message?: string } = {}) {
    const name = netlinkErrnoName(errno);
    const msg = opts.message ?? `${op}: ${name} (${strerror(errno)})${extAck ? `: ${extAck}` : ''}`;
    super(ErrorCode.Netlink, msg, { cause: opts.cause });
    this.name = 'NetlinkError';
    this.errno = errno;
    this.errnoName = name;
    this.op = op;
    this.extAck = extAck;
  }
}

export function isNetlinkError(e: unknown, ...names: string[]): e is NetlinkError {
  if (!(e instanceof NetlinkError)) return false;
  const errnos = os.constants.errno as Record<string, number>;
  // Compare numbers, so 'ENOTSUP' and 'EOPNOTSUPP' both match errno 95.
  return names.length === 0 || names.some((n) => n === e.errnoName || errnos[n] === e.errno);
}
