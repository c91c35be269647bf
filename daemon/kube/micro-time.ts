// The API's MicroTime fields (Event eventTime and series, Lease acquireTime and renewTime) are parsed by the
// API server with Go's RFC3339Micro layout: exactly six fractional digits. A Date serialised by client-node
// (JavaScript's three) is refused (kubernetes/kubernetes#94748), so such fields are sent as strings.

/** `ms` as MicroTime: RFC 3339 in UTC with exactly six fractional digits. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}
