// Every format two tether releases exchange or share, with its version and the versions this release reads:
// the contract a rolling upgrade relies on (release N beside N−1, both directions; docs/upgrade.md).
// test/unit/formats.test.ts holds each entry to a golden sample per version and fails on a format change
// without a new version, and on a format-defining module this list does not name.
import { PROTOCOL_VERSION as API_VERSION, MIN_PROTOCOL_VERSION as API_MIN_VERSION } from '../lib/api/protocol';
import { DELETE_QUEUE_FORMAT } from '../lib/api/delete-queue';
import { BFD_VERSION } from './bfd/packet';
import { MAX_PROTOCOL_VERSION as SYNC_MAX_VERSION, MIN_PROTOCOL_VERSION as SYNC_MIN_VERSION, PROTOCOL_VERSION as SYNC_VERSION } from './conntrack-sync/frame';
import { CRDS, GROUP, VERSION as CRD_VERSION } from './objects/crds';
import { FOU_MAP_LAYOUTS } from './bpf/fou-structs';
import { EGRESS_MAP_LAYOUTS } from './bpf/egress-structs';
import { LB_MAP_LAYOUTS } from './bpf/lb-structs';
import { GUARD_MAP_LAYOUTS } from './bpf/egress-guard';
import { VIP_RECORD_VERSION } from './lb/vip-record';
import type { MapLayout } from './bpf/map-layout';

export type FormatKind =
  | 'socket API'
  | 'delete-queue file'
  | 'state record'
  | 'pinned map'
  | 'store key/value'
  | 'pub/sub notice'
  | 'ownership notice'
  | 'BFD'
  | 'conntrack sync frame'
  | 'FoU allow-list source'
  | 'CRD';

export interface FormatEntry {
  /** Unique; also the fixture directory test/fixtures/formats/<name>/. */
  name: string;
  kind: FormatKind;
  /** The modules whose encoder/writer and reader define it (repository paths). */
  definedIn: string[];
  /** What this release writes. */
  version: number;
  /** Every version this release's reader accepts (always includes `version`). */
  reads: number[];
  /** Where the version travels; "absent = 1" for formats written without one before they were versioned. */
  versionField: string;
  /** What it is, in a line. */
  summary: string;
  /** What each version changed, by version (for docs/upgrade.md). */
  history: Record<number, string>;
}

const range = (min: number, max: number): number[] => Array.from({ length: max - min + 1 }, (_, i) => min + i);

/** Files of the pinned maps' TypeScript mirrors and declarations, by object. */
const MAP_SOURCES: Array<[Record<string, MapLayout>, string, string[]]> = [
  [FOU_MAP_LAYOUTS, 'daemon/bpf/fou-structs.ts', ['bpf/fou-encap-maps.h', 'bpf/fou-decap-maps.h']],
  [EGRESS_MAP_LAYOUTS, 'daemon/bpf/egress-structs.ts', ['bpf/egress-maps.h']],
  [LB_MAP_LAYOUTS, 'daemon/bpf/lb-structs.ts', ['bpf/lb-maps.h']],
  [GUARD_MAP_LAYOUTS, 'daemon/bpf/egress-guard.ts', ['bpf/egress-guard.bpf.c']],
];

/** One entry per pinned map: its version is the one map-layout.ts records beside the pin. */
function pinnedMaps(): FormatEntry[] {
  const out: FormatEntry[] = [];
  for (const [layouts, mirror, headers] of MAP_SOURCES) {
    for (const [map, layout] of Object.entries(layouts)) {
      const older = Object.keys(layout.from ?? {}).map(Number);
      out.push({
        name: `map-${map}`,
        kind: 'pinned map',
        definedIn: [mirror, ...headers, 'daemon/bpf/map-layout.ts'],
        version: layout.version,
        reads: [...new Set([...older, layout.version])].sort((a, b) => a - b),
        versionField: 'the @layout record beside the pin (map-layout.ts); a pin without one is version 1',
        summary: `pinned map ${map}: type, key and value layout; an older pin is migrated (${typeof layout.convert === 'string' ? layout.convert : 'custom'})`,
        history: { 1: 'first versioned layout' },
      });
    }
  }
  return out;
}

/** One entry per custom resource kind. */
function crds(): FormatEntry[] {
  return CRDS.map((d) => {
    const rev = CRD_SCHEMA_REVISIONS[d.kind];
    return {
      name: `crd-${d.kind.toLowerCase()}`,
      kind: 'CRD' as const,
      definedIn: ['daemon/objects/crds.ts', 'daemon/objects/schema.ts'],
      // The API version v1alpha1 is format version 1; a later revision of its schema that only adds optional
      // fields (every object valid before stays valid) is a new format version under the same API version.
      // A v1alpha2 or v1 would need a conversion.
      version: rev ? rev.version : crdVersionNumber(CRD_VERSION),
      reads: rev ? rev.reads : [crdVersionNumber(CRD_VERSION)],
      versionField: `apiVersion ${GROUP}/${CRD_VERSION}`,
      summary: `${d.kind} (${d.scope}${d.reportOnly ? ', written by tetherd only' : ''}): its schema as served`,
      history: { 1: `${GROUP}/v1alpha1`, ...(rev?.history ?? {}) },
    };
  });
}

/**
 * Additive revisions of a CRD's schema within v1alpha1. The previous release validates the objects itself, so
 * it refuses one that uses a new field (reported by name on that node) and takes every other as before.
 */
const CRD_SCHEMA_REVISIONS: Record<string, { version: number; reads: number[]; history: Record<number, string> }> = {
  Egress: { version: 2, reads: [1, 2], history: { 2: `${GROUP}/v1alpha1 with spec.ipFamilies and IPv6 explicit addresses (optional: every v1 object is still valid)` } },
};

/** The format version of a CRD API version: v1alpha1 is 1; later ones are listed here when they come. */
export function crdVersionNumber(apiVersion: string): number {
  const known: Record<string, number> = { v1alpha1: 1 };
  const n = known[apiVersion];
  if (n === undefined) throw new Error(`CRD version ${apiVersion} has no format version in daemon/formats.ts`);
  return n;
}

export const FORMATS: readonly FormatEntry[] = [
  {
    name: 'socket-api',
    kind: 'socket API',
    definedIn: ['lib/api/protocol.ts', 'lib/api/call-core.ts', 'daemon/server.ts', 'cni/bun-connector.ts'],
    version: API_VERSION,
    reads: range(API_MIN_VERSION, API_VERSION),
    versionField: 'request and response `version`',
    summary: 'one JSON request line and one JSON response line on tetherd\'s Unix socket (tether, tether-ipam, tetherctl)',
    history: { 1: 'first version; 0.2.0: tetherd answers any version in MIN_PROTOCOL_VERSION..PROTOCOL_VERSION, and a client retries once with the lower version a daemon names' },
  },
  {
    name: 'delete-queue-file',
    kind: 'delete-queue file',
    definedIn: ['lib/api/delete-queue.ts', 'daemon/pod/delete-queue.ts'],
    version: DELETE_QUEUE_FORMAT,
    reads: [DELETE_QUEUE_FORMAT],
    versionField: '`format`',
    summary: 'a DEL the CNI executables could not hand to tetherd, one JSON file per request under <state-dir>/delete-queue',
    history: { 1: 'first version' },
  },
  {
    name: 'pod-record',
    kind: 'state record',
    definedIn: ['daemon/state/pod-store.ts', 'lib/atomic-file.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1 (a later version adds `format`, which 0.1.0 ignores)',
    summary: 'one attached pod, <state-dir>/pods/<sha256 of network, container, interface>.json',
    history: { 1: 'first version (file names by SHA-256; records under the earlier URI-encoded names are renamed on load)' },
  },
  {
    name: 'sysctl-journal',
    kind: 'state record',
    definedIn: ['daemon/sys/sysctl-journal.ts', 'lib/atomic-file.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'the node sysctls tetherd changed and their values before, <state-dir>/sysctl-journal.json',
    history: { 1: 'first version' },
  },
  {
    name: 'lb-vip-record',
    kind: 'state record',
    definedIn: ['daemon/lb/vip-record.ts', 'lib/atomic-file.ts'],
    version: VIP_RECORD_VERSION,
    reads: [VIP_RECORD_VERSION],
    versionField: '`v`; absent = version 1',
    summary: 'the VIPs this node learned from the store, <state-dir>/lb-vips.json: a fallback while the store is unreachable',
    history: { 1: 'new in 0.2.0 (0.1.0 neither writes nor reads it; a rollback leaves it unread). Entries of IPv6 VIPs (key <ns>/<name>#IPv6) came later within version 1: a release that takes IPv4 VIPs only passes over them' },
  },
  {
    name: 'ipam-allocation-record',
    kind: 'state record',
    definedIn: ['ipam/allocation-store.ts', 'lib/atomic-file.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'node-local allocations, <state-dir>/ipam/<pool>/addrs/<address>.json, and the node\'s blocks, <state-dir>/ipam/<pool>/blocks.json',
    history: { 1: 'first version' },
  },
  {
    name: 'node-registry',
    kind: 'FoU allow-list source',
    definedIn: ['daemon/common/node-registry.ts', 'daemon/common/member-registry.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1; the value is a JSON object whose unknown fields readers ignore',
    summary: 'member set {<prefix>nodes} (+ :expiry, :version, :log): node → {"address", "release"?, "address6"?}; FoU receivers accept only these addresses',
    history: {
      1: 'member set (before 0.1.0 a hash with TTL fields under another key); 0.2.0 adds the optional "release" (the node\'s tether release), which 0.1.0 ignores; the optional "address6" (the node\'s IPv6 address, the outer source of FoU to an IPv6 VIP\'s targets) is added beside it, which releases before ignore; a node on an IPv6 underlay (0.2.0, new) writes its "address" in brackets ("[fd00::1]"), which 0.1.0 refuses by that field (a logged refusal, kept out of its FoU allow-lists) instead of taking it for an IPv4 underlay address; IPv4 nodes write as before',
    },
  },
  {
    name: 'gateway-registry',
    kind: 'store key/value',
    definedIn: ['daemon/egress/ownership-store.ts', 'daemon/common/member-registry.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'member set {<prefix>egress:<egress>}:gateways: node → {"gateways": [{pod, node, nodeAddress, podIp, zone?, maxAddresses?}]}',
    history: { 1: 'member set (before 0.1.0 a hash with TTL fields); 0.2.0: a nodeAddress on an IPv6 underlay is written in brackets, which 0.1.0 refuses by that field (the node\'s registration is left out); IPv4 unchanged' },
  },
  {
    name: 'egress-ownership-record',
    kind: 'store key/value',
    definedIn: ['daemon/egress/ownership-store.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1 (records without score and owner location, from before, are read without location)',
    summary: 'hash <prefix>egress:<egress>:owner:<address>: owner, epoch, cause, at, score, ownerNode, ownerNodeAddress, ownerPodIp',
    history: { 1: 'first version; 0.2.0: an ownerNodeAddress on an IPv6 underlay is written in brackets, which 0.1.0 refuses by that field (the record is unreadable to it: it claims nothing); IPv4 unchanged' },
  },
  {
    name: 'egress-ownership-pubsub',
    kind: 'pub/sub notice',
    definedIn: ['daemon/egress/ownership-store.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'channel <prefix>egress-ownership: JSON {egress, address, owner, epoch, cause, ownerNode, ownerNodeAddress, ownerPodIp} per recorded decision',
    history: { 1: 'first version; 0.2.0: an ownerNodeAddress on an IPv6 underlay is in brackets, as in the record; 0.1.0 refuses such a notice by that field' },
  },
  {
    name: 'egress-usage-report',
    kind: 'store key/value',
    definedIn: ['daemon/egress/ownership-store.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'hash {<prefix>egress:<egress>}:usage (+ :expiry): node → {"usage": {address: {flows, bytes}}}',
    history: { 1: 'first version' },
  },
  {
    name: 'ipam-store',
    kind: 'store key/value',
    definedIn: ['ipam/store/redis-store.ts', 'ipam/store/redis-scripts.ts'],
    version: 2,
    reads: [1, 2],
    versionField: 'none: the key names tell (version 1 untagged, version 2 hash-tagged)',
    summary: 'blocks, cluster-wide addresses and the store generation: <prefix>pool:{<pool>}:blocks|addrs|owner:<owner>|generation, <prefix>{generation}[:born|:restarted|:pools]',
    history: {
      1: 'untagged keys (<prefix>pool:<pool>:blocks, <prefix>generation …)',
      2: 'hash-tagged keys (issue 21, before 0.1.0); a store that still has version 1 keys is used in compat mode: both are read and written, nothing deleted',
    },
  },
  {
    name: 'lb-mapping-store',
    kind: 'store key/value',
    definedIn: ['daemon/lb/mapping-store.ts', 'daemon/lb/mapping-fields.ts', 'daemon/lb/expirer-lease.ts'],
    version: 2,
    reads: [1, 2],
    versionField: 'none: the field tells (an IPv6 client in brackets is version 2; every IPv4 field is both)',
    summary: `client → target mappings: hash <prefix>lb:{<vip>#<bucket>}:map (field c:<client> or f:<client>:<proto>:<vport>:<cport>, an IPv6 client as [<client>] → target of the VIP's family) and zset :used, expirer lease <prefix>lb:{<vip>}:expirer`,
    history: {
      1: 'first version',
      2: 'IPv6 VIPs: an IPv6 client is written in brackets (c:[<client>], f:[<client>]:<proto>:<vport>:<cport>, canonical text) under the IPv6 VIP\'s keys, with IPv6 targets; IPv4 VIPs\' keys and fields are unchanged. A release before reads a bracketed field as no mapping (refused by name, never misread) and serves no IPv6 VIP',
    },
  },
  {
    name: 'lb-table-version',
    kind: 'store key/value',
    definedIn: ['daemon/lb/table-versions.ts'],
    version: 1,
    reads: [1],
    versionField: 'field "format" of the hash; a reader refuses another format by name',
    summary: 'hash <prefix>lb:{<vip>}:table: active and next as "<version>|<ms>|<row>", members m:<node> (expiry ms), d:<node> (row wanted), a:<node> (version acknowledged)',
    history: { 1: 'first version (issue 32): releases before it never read or write the key; they switch rows at once and record every pick' },
  },
  {
    name: 'lb-mapping-notice',
    kind: 'pub/sub notice',
    definedIn: ['daemon/lb/mapping-notices.ts', 'daemon/lb/mapping-fields.ts'],
    version: 2,
    reads: [1, 2],
    versionField: 'none: the field tells (an IPv6 client in brackets is version 2)',
    summary: 'channel <prefix>lb:{<vip>}:notices: JSON {vip, mappings: [[field, target], …]} of new mappings, the fields as in lb-mapping-store',
    history: {
      1: 'first version',
      2: 'IPv6 VIPs: notices on an IPv6 VIP\'s channel, its fields with the client in brackets (lb-mapping-store v2) and IPv6 targets; IPv4 notices unchanged. A release before subscribes to no IPv6 VIP\'s channel',
    },
  },
  {
    name: 'lb-health-report',
    kind: 'store key/value',
    definedIn: ['daemon/health/health-reports.ts', 'daemon/health/health-controller.ts'],
    version: 1,
    reads: [1],
    versionField: 'none: absent = version 1',
    summary: 'hash <prefix>lb:health: node → {"report": {eligible, healthy, services, notForwarded?}, "expiresAt"}',
    history: { 1: 'first version; the optional "notForwarded" (VIPs the node\'s LB pods select that it does not forward: an IPv6 VIP on a node without an IPv6 address), left out when there is none, is added beside it, which releases before ignore' },
  },
  {
    name: 'ownership-notice',
    kind: 'ownership notice',
    definedIn: ['daemon/egress/ownership-notice.ts'],
    version: 1,
    reads: [1],
    versionField: 'byte 4 of the "TOWN" header',
    summary: 'UDP datagram: 8-byte header, HMAC-SHA256, JSON envelope {from, boot, seq, at, notices, gateways?, clients?}',
    history: { 1: 'first version (gateways and clients are optional fields older senders leave out)' },
  },
  {
    name: 'bfd-control',
    kind: 'BFD',
    definedIn: ['daemon/bfd/packet.ts', 'daemon/bfd/auth.ts'],
    version: BFD_VERSION,
    reads: [BFD_VERSION],
    versionField: 'the 3-bit version of the first byte (RFC 5880)',
    summary: 'BFD control packet (RFC 5880/5881), with authentication',
    history: { 1: 'RFC 5880 version 1' },
  },
  {
    name: 'conntrack-sync-frame',
    kind: 'conntrack sync frame',
    definedIn: ['daemon/conntrack-sync/frame.ts', 'daemon/conntrack-sync/entry-codec.ts', 'daemon/conntrack-sync/handshake.ts', 'daemon/conntrack-sync/digest.ts'],
    version: SYNC_VERSION,
    reads: range(SYNC_MIN_VERSION, SYNC_MAX_VERSION),
    versionField: 'byte 4 of every frame; the versions a side speaks in the last 8 bytes of its HELLO nonce ("tether", min, max; absent = exactly 2)',
    summary: 'length-prefixed, sequenced, HMAC-sealed frames between the owner of a floating address and its standbys; conntrack entries in entry-codec.ts',
    history: {
      1: 'first version',
      2: 'before 0.1.0: RESYNC_BEGIN names its buckets, DIGEST and BUCKET_REQUEST (a 1 and a 2 refuse each other); 0.2.0: each side advertises MIN..MAX in its HELLO nonce (0.1.0 reads the nonce as opaque bytes) and both speak the highest shared version, refusing the other as `version` when none is shared',
    },
  },
  ...pinnedMaps(),
  ...crds(),
];

export function formatNamed(name: string): FormatEntry {
  const f = FORMATS.find((x) => x.name === name);
  if (!f) throw new Error(`no format named ${name} in daemon/formats.ts`);
  return f;
}
