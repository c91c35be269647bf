// One error base class for all of Tether: every error has a stable code, a clear message and a cause.
// The codes travel over the socket API and map onto CNI error codes in one table (cniCodeFor).

export const ErrorCode = {
  IncompatibleVersion: 'INCOMPATIBLE_VERSION',
  UnsupportedField: 'UNSUPPORTED_FIELD',
  UnknownContainer: 'UNKNOWN_CONTAINER',
  InvalidEnvironment: 'INVALID_ENVIRONMENT',
  IoFailure: 'IO_FAILURE',
  DecodeFailure: 'DECODE_FAILURE',
  InvalidConfig: 'INVALID_CONFIG',
  TryAgainLater: 'TRY_AGAIN_LATER',
  PermissionDenied: 'PERMISSION_DENIED',
  ProtocolVersion: 'PROTOCOL_VERSION',
  BadRequest: 'BAD_REQUEST',
  NetnsGone: 'NETNS_GONE',
  Netlink: 'NETLINK',
  Bpf: 'BPF',
  CheckFailed: 'CHECK_FAILED',
  UnknownPool: 'UNKNOWN_POOL',
  PoolExhausted: 'POOL_EXHAUSTED',
  AddressConflict: 'ADDRESS_CONFLICT',
  Internal: 'INTERNAL',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

// CNI spec error codes (SPEC.md "Error"): 1 incompatible version, 2 unsupported field, 3 unknown container,
// 4 invalid environment variables, 5 I/O failure, 6 decode failure, 7 invalid network config,
// 11 try again later. 100+ are plugin-specific.
const CNI_CODES: Record<ErrorCode, number> = {
  INCOMPATIBLE_VERSION: 1,
  UNSUPPORTED_FIELD: 2,
  UNKNOWN_CONTAINER: 3,
  INVALID_ENVIRONMENT: 4,
  IO_FAILURE: 5,
  DECODE_FAILURE: 6,
  INVALID_CONFIG: 7,
  TRY_AGAIN_LATER: 11,
  // Not allowed to reach tetherd's socket (EACCES/EPERM): an I/O failure no retry will clear.
  PERMISSION_DENIED: 5,
  PROTOCOL_VERSION: 100,
  BAD_REQUEST: 101,
  NETNS_GONE: 102,
  NETLINK: 103,
  BPF: 104,
  CHECK_FAILED: 105,
  // An unknown pool is a config error as far as the runtime is concerned.
  UNKNOWN_POOL: 7,
  POOL_EXHAUSTED: 106,
  ADDRESS_CONFLICT: 107,
  INTERNAL: 199,
};

export function cniCodeFor(code: string): number {
  return (CNI_CODES as Record<string, number>)[code] ?? CNI_CODES.INTERNAL;
}

export class TetherError extends Error {
  readonly code: ErrorCode;
  readonly details?: string;

  constructor(code: ErrorCode, message: string, opts: { details?: string; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'TetherError';
    this.code = code;
    this.details = opts.details;
  }
}

export function isTetherError(e: unknown): e is TetherError {
  return e instanceof TetherError;
}

/** Any thrown value as a TetherError, keeping the original as cause. */
export function asTetherError(e: unknown, fallback: ErrorCode = ErrorCode.Internal): TetherError {
  if (e instanceof TetherError) return e;
  const msg = e instanceof Error ? e.message : String(e);
  return new TetherError(fallback, msg, { cause: e });
}
