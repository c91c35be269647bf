// The custom resources of group tether.dev: the one source of truth for their shape. The CRD manifests in
// install/crds/ are generated from these definitions (install/gen-crds.ts; a test fails when they differ),
// and the file source validates its objects with the same schemas, CEL rules included (schema.ts).
// Checks a schema cannot express (pool overlaps, an unknown pool, an address outside its pool) stay in
// the subsystems' resolvers and are reported as conditions on the object.

export const GROUP = 'tether.dev';
export const VERSION = 'v1alpha1';

type Schema = Record<string, unknown>;

const condition: Schema = {
  type: 'object',
  description: 'metav1.Condition',
  required: ['type', 'status', 'lastTransitionTime', 'reason', 'message'],
  properties: {
    type: { type: 'string', maxLength: 316, pattern: '^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$' },
    status: { type: 'string', enum: ['True', 'False', 'Unknown'] },
    observedGeneration: { type: 'integer', format: 'int64', minimum: 0 },
    lastTransitionTime: { type: 'string', format: 'date-time' },
    reason: { type: 'string', maxLength: 1024, minLength: 1, pattern: '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$' },
    message: { type: 'string', maxLength: 32768 },
  },
};

const conditions: Schema = {
  type: 'array',
  items: condition,
  'x-kubernetes-list-type': 'map',
  'x-kubernetes-list-map-keys': ['type'],
};

const labelMap: Schema = { type: 'object', additionalProperties: { type: 'string', maxLength: 63 } };

const labelSelector: Schema = {
  type: 'object',
  description: 'Pods whose labels match all of matchLabels (an empty selector selects every pod of the namespace).',
  properties: { matchLabels: labelMap },
};

/** What an Egress answers to a selector that names a namespace (the one message for files and custom resources). */
export const OWN_NAMESPACE_ONLY = "an Egress selects pods in its own namespace only: remove namespace and create the Egress in the pods' namespace";

// An Egress selects pods of its own namespace only: otherwise anyone allowed to create an Egress in one
// namespace could route another namespace's traffic through gateways of their choice (or make another
// namespace's pods its gateways). `namespace` stays in the schema only to be refused by name: dropped from
// it, the API server would prune it (without strict field validation) and an Egress written for another
// namespace would silently select pods of its own. CEL cannot compare it with metadata.namespace (a rule
// sees only the name of the object), so even the Egress's own namespace is refused.
const podSelection: Schema = {
  type: 'object',
  required: ['podSelector'],
  properties: {
    namespace: { type: 'string', maxLength: 63, description: "Not allowed: an Egress selects pods in its own namespace only." },
    podSelector: labelSelector,
  },
  'x-kubernetes-validations': [{ rule: '!has(self.namespace)', fieldPath: '.namespace', message: OWN_NAMESPACE_ONLY }],
};

const family = (v: 4 | 6): Schema => ({
  type: 'object',
  required: ['cidr'],
  properties: {
    cidr: { type: 'string', format: 'cidr', description: `The pool's IPv${v} subnet (a network address with its prefix).` },
    blockSize: { type: 'integer', minimum: 0, maximum: v === 4 ? 32 : 128, description: 'Prefix length of the blocks nodes claim (pod pools only).' },
  },
});

// A family, once set, keeps its cidr and blockSize and stays: addresses and node blocks are allocated from
// it (block claims are keyed by their CIDR, so a new blockSize would let two nodes claim overlapping
// blocks). A family may be added to a pool. The rules sit on spec, where the family's presence on both
// sides is itself checked: a transition rule on the family node would not run when the family is absent
// on either side, and the family could be removed in one update and added back with a new cidr in the next.
const familyFixed = (f: 'ipv4' | 'ipv6'): Schema[] => [
  { rule: `!has(oldSelf.${f}) || has(self.${f})`, fieldPath: `.${f}`, message: `${f} cannot be removed once set: addresses are allocated from it; create a new pool instead` },
  {
    rule: `!has(oldSelf.${f}) || !has(self.${f}) || self.${f} == oldSelf.${f}`,
    fieldPath: `.${f}`,
    message: `${f} is immutable once set (cidr and blockSize): addresses are allocated from it; create a new pool instead`,
  },
];

/** What every object's schema has around its spec and status (the API server checks these itself). */
const OBJECT_ENVELOPE = {
  apiVersion: { type: 'string' },
  kind: { type: 'string' },
  metadata: { type: 'object' },
} as const;

const addressPoolSchema: Schema = {
  type: 'object',
  required: ['spec'],
  properties: {
    ...OBJECT_ENVELOPE,
    spec: {
      type: 'object',
      required: ['usage'],
      properties: {
        usage: { type: 'string', enum: ['pod', 'floating', 'loadBalancer'], description: 'pod: split into node blocks; floating and loadBalancer: allocated cluster-wide.' },
        ipv4: family(4),
        ipv6: family(6),
        nodeSelector: { ...labelMap, description: 'Only nodes whose labels match all of these may use the pool.' },
        zone: { type: 'string', maxLength: 63, description: 'Shorthand for nodeSelector {topology.kubernetes.io/zone: zone}.' },
        reserved: { type: 'array', items: { type: 'string' }, maxItems: 1024, description: 'Addresses or CIDRs inside the pool that are never handed out.' },
      },
      'x-kubernetes-validations': [
        { rule: 'has(self.ipv4) || has(self.ipv6)', message: 'needs ipv4, ipv6 or both' },
        { rule: 'self.usage == oldSelf.usage', fieldPath: '.usage', message: 'usage is immutable: create a new pool instead' },
        ...familyFixed('ipv4'),
        ...familyFixed('ipv6'),
        {
          rule: "self.usage == 'pod' || ((!has(self.ipv4) || !has(self.ipv4.blockSize)) && (!has(self.ipv6) || !has(self.ipv6.blockSize)))",
          message: 'blockSize applies to pod pools only (floating and loadBalancer addresses are allocated cluster-wide)',
        },
      ],
    },
    status: {
      type: 'object',
      properties: {
        observedGeneration: { type: 'integer', format: 'int64' },
        conditions,
        blocks: { type: 'integer', description: 'Node blocks claimed (pod pools).' },
        allocated: { type: 'integer', description: 'Addresses allocated cluster-wide (floating and loadBalancer pools).' },
      },
    },
  },
};

const egressSchema: Schema = {
  type: 'object',
  required: ['spec'],
  properties: {
    ...OBJECT_ENVELOPE,
    spec: {
      type: 'object',
      required: ['clients', 'gateways', 'addresses'],
      properties: {
        clients: { ...podSelection, description: 'Pods whose traffic to the destinations leaves through the floating addresses.' },
        gateways: { ...podSelection, description: 'Pods that may hold the floating addresses and NAT to them.' },
        ipFamilies: {
          type: 'array',
          items: { type: 'string', enum: ['IPv4', 'IPv6'] },
          minItems: 1,
          maxItems: 2,
          'x-kubernetes-list-type': 'set',
          description: "The families steered, each leaving from addresses of its own family (a count takes that many per family). Default: the destinations' families, else the explicit addresses', else each pool's first family.",
        },
        destinations: { type: 'array', items: { type: 'string', format: 'cidr' }, minItems: 1, maxItems: 64, description: 'Default: everything outside the cluster, in each family of the Egress.' },
        excludeDestinations: { type: 'array', items: { type: 'string', format: 'cidr' }, maxItems: 64 },
        addresses: {
          type: 'object',
          description: 'The floating addresses: count from pool, a count from each of several pools, or explicit addresses. Changed live: an address added or removed moves no other flow.',
          properties: {
            pool: { type: 'string', maxLength: 63, description: 'A floating AddressPool.' },
            count: { type: 'integer', minimum: 1, maximum: 16, description: 'How many addresses (default 1).' },
            pools: {
              type: 'array',
              minItems: 1,
              maxItems: 16,
              description: 'A count from each of several floating pools (e.g. one pool per zone).',
              items: {
                type: 'object',
                required: ['pool'],
                properties: { pool: { type: 'string', maxLength: 63 }, count: { type: 'integer', minimum: 1, maximum: 16 } },
              },
            },
            explicit: { type: 'array', items: { type: 'string', format: 'ip' }, minItems: 1, maxItems: 16, description: 'IPv4, IPv6, or some of each (a dual-stack Egress).' },
          },
          'x-kubernetes-validations': [
            { rule: '[has(self.count), has(self.explicit), has(self.pools)].filter(x, x).size() <= 1', message: 'give one of count, pools, explicit' },
            { rule: 'has(self.pool) || has(self.explicit) || has(self.pools)', message: 'name a floating pool, pools, or explicit addresses' },
            { rule: '!(has(self.pools) && has(self.pool))', message: 'pool and pools are two ways to name pools: give one' },
          ],
        },
        zonePolicy: {
          type: 'string',
          enum: ['any', 'preferLocalNode', 'preferZone', 'requireZone'],
          description: "How a client's new flows choose among the addresses (default any): those held on its own node, or in its node's zone (topology.kubernetes.io/zone) first; requireZone drops traffic when its zone holds none.",
        },
        maxAddressesPerNode: { type: 'integer', minimum: 1, maximum: 16, description: "At most this many of the Egress's addresses on one node (a node's tether.dev/max-egress-addresses label overrides it)." },
        failover: {
          type: 'object',
          properties: {
            intervalMs: { type: 'integer', minimum: 10, maximum: 10000, description: 'BFD transmit interval (default 50).' },
            detectMultiplier: { type: 'integer', minimum: 2, maximum: 255, description: 'Missed intervals before a peer is down (default 3).' },
          },
        },
        announce: {
          type: 'object',
          properties: {
            mode: { type: 'string', enum: ['l2', 'routeTable'] },
            table: { type: 'integer', minimum: 1, maximum: 4294967294 },
          },
          'x-kubernetes-validations': [
            { rule: "!has(self.table) || (has(self.mode) && self.mode == 'routeTable')", message: 'table applies to mode routeTable only' },
            { rule: '!has(self.table) || !(self.table in [253, 254, 255])', message: 'table must not be one of the kernel tables 253, 254, 255' },
          ],
        },
      },
    },
    status: {
      type: 'object',
      properties: {
        observedGeneration: { type: 'integer', format: 'int64' },
        conditions,
        // Counts for kubectl's columns (a printer column's JSONPath shows one value of a list, not a count).
        wanted: { type: 'integer', minimum: 0, description: 'Addresses spec.addresses asks for.' },
        allocated: { type: 'integer', minimum: 0, description: 'Addresses allocated from their pools.' },
        held: { type: 'integer', minimum: 0, description: 'Addresses held by a live gateway.' },
        nodes: { type: 'integer', minimum: 0, description: 'Nodes holding them.' },
        addresses: {
          type: 'array',
          'x-kubernetes-list-type': 'map',
          'x-kubernetes-list-map-keys': ['address'],
          items: {
            type: 'object',
            required: ['address'],
            properties: {
              address: { type: 'string' },
              ownerNode: { type: 'string' },
              ownerPod: { type: 'string' },
              zone: { type: 'string' },
              epoch: { type: 'integer', format: 'int64' },
              flows: { type: 'integer', format: 'int64', description: 'Flows pinned to it by the clients of every node (refreshed at most every 30 s).' },
              bytes: { type: 'integer', format: 'int64', description: 'Bytes steered to it by the clients of every node.' },
            },
          },
        },
      },
    },
  },
};

const addressBlockSchema: Schema = {
  type: 'object',
  required: ['spec'],
  properties: {
    ...OBJECT_ENVELOPE,
    spec: {
      type: 'object',
      required: ['pool', 'cidr', 'node'],
      properties: {
        pool: { type: 'string', maxLength: 63 },
        cidr: { type: 'string', format: 'cidr' },
        node: { type: 'string', maxLength: 253 },
      },
      'x-kubernetes-validations': [{ rule: 'self == oldSelf', message: 'a block claim is immutable: delete it to release the block' }],
    },
  },
};

/**
 * One per node, named after it, written by that node's tetherd only (status: conditions Ready,
 * DatapathAttached, StoreReachable; its version; a heartbeat at most once a minute). Owned by the core
 * Node (ownerReference), so it goes with the Node. Not configuration: never read from a config file.
 */
const tetherNodeSchema: Schema = {
  type: 'object',
  properties: {
    ...OBJECT_ENVELOPE,
    status: {
      type: 'object',
      properties: {
        conditions,
        version: { type: 'string', maxLength: 64, description: "The node's tetherd version." },
        lastHeartbeatTime: { type: 'string', format: 'date-time', description: 'When tetherd last wrote this status: on every change, and at least once a minute while it runs.' },
      },
    },
  },
};

/** The Node facts of the file source (zone, labels); in a cluster they come from the core Node. Not a CRD. */
export const NODE_SCHEMA: Schema = {
  type: 'object',
  properties: {
    ...OBJECT_ENVELOPE,
    spec: { type: 'object', properties: { zone: { type: 'string', minLength: 1, maxLength: 63 } } },
    status: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
  },
};

export interface CrdDef {
  kind: string;
  plural: string;
  singular: string;
  shortNames: string[];
  scope: 'Namespaced' | 'Cluster';
  schema: Schema;
  columns: Array<{ name: string; type: string; jsonPath: string; description?: string; priority?: number }>;
  /** Has a status subresource (written by tether's controllers). */
  status: boolean;
  /** Written by tetherd only, never configuration: a config file cannot hold one. */
  reportOnly?: boolean;
}

// A printer column shows the first value its JSONPath finds: columns name single values (counts the leader
// writes into status, not lists). priority 1: shown with -o wide only.
const age = { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' };
const ready = (what: string) => ({ name: 'Ready', type: 'string', jsonPath: ".status.conditions[?(@.type=='Ready')].status", description: what });
const reason = { name: 'Reason', type: 'string', jsonPath: ".status.conditions[?(@.type=='Ready')].reason", description: 'Why it is (not) Ready', priority: 1 };

export const CRDS: CrdDef[] = [
  {
    kind: 'AddressPool',
    plural: 'addresspools',
    singular: 'addresspool',
    shortNames: ['tpool'],
    scope: 'Cluster',
    schema: addressPoolSchema,
    status: true,
    columns: [
      { name: 'Usage', type: 'string', jsonPath: '.spec.usage' },
      { name: 'IPv4', type: 'string', jsonPath: '.spec.ipv4.cidr' },
      { name: 'IPv6', type: 'string', jsonPath: '.spec.ipv6.cidr' },
      ready('The pool is valid and overlaps no other pool'),
      age,
      { name: 'Zone', type: 'string', jsonPath: '.spec.zone', priority: 1 },
      reason,
    ],
  },
  {
    kind: 'Egress',
    plural: 'egresses',
    singular: 'egress',
    shortNames: ['teg'],
    scope: 'Namespaced',
    schema: egressSchema,
    status: true,
    columns: [
      { name: 'Wanted', type: 'integer', jsonPath: '.status.wanted', description: 'Addresses spec.addresses asks for' },
      { name: 'Held', type: 'integer', jsonPath: '.status.held', description: 'Addresses held by a live gateway' },
      ready('Every address has a live owner'),
      age,
      { name: 'Allocated', type: 'integer', jsonPath: '.status.allocated', description: 'Addresses allocated from their pools', priority: 1 },
      { name: 'Nodes', type: 'integer', jsonPath: '.status.nodes', description: 'Nodes holding them', priority: 1 },
      reason,
    ],
  },
  {
    kind: 'AddressBlock',
    plural: 'addressblocks',
    singular: 'addressblock',
    shortNames: ['tblock'],
    scope: 'Cluster',
    schema: addressBlockSchema,
    status: false,
    columns: [
      { name: 'Pool', type: 'string', jsonPath: '.spec.pool' },
      { name: 'CIDR', type: 'string', jsonPath: '.spec.cidr' },
      { name: 'Node', type: 'string', jsonPath: '.spec.node' },
      age,
    ],
  },
  {
    kind: 'TetherNode',
    plural: 'tethernodes',
    singular: 'tethernode',
    shortNames: ['tnode'],
    scope: 'Cluster',
    schema: tetherNodeSchema,
    status: true,
    reportOnly: true,
    columns: [
      ready("tetherd started and its reconcilers run"),
      { name: 'Datapath', type: 'string', jsonPath: ".status.conditions[?(@.type=='DatapathAttached')].status", description: "tether's eBPF programs are attached for every pod role" },
      { name: 'Store', type: 'string', jsonPath: ".status.conditions[?(@.type=='StoreReachable')].status", description: 'The cluster store answers' },
      { name: 'Version', type: 'string', jsonPath: '.status.version' },
      { name: 'Heartbeat', type: 'date', jsonPath: '.status.lastHeartbeatTime', description: 'Older than two minutes: tetherd is not running on the node', priority: 1 },
      age,
    ],
  },
];

/** The CustomResourceDefinition object of one kind, as `kubectl apply` takes it. */
export function crdManifest(d: CrdDef): Record<string, unknown> {
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: `${d.plural}.${GROUP}` },
    spec: {
      group: GROUP,
      scope: d.scope,
      names: { kind: d.kind, listKind: `${d.kind}List`, plural: d.plural, singular: d.singular, shortNames: d.shortNames, categories: ['tether'] },
      versions: [
        {
          name: VERSION,
          served: true,
          storage: true,
          ...(d.status ? { subresources: { status: {} } } : {}),
          additionalPrinterColumns: d.columns,
          schema: { openAPIV3Schema: d.schema },
        },
      ],
    },
  };
}
