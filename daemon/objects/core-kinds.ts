// Schemas of the core Kubernetes kinds the file source accepts for the load balancer: a Service (type
// LoadBalancer, of tether's loadBalancerClass) and its EndpointSlices. They are the subsets of the API's
// own OpenAPI that a Service or EndpointSlice written for a cluster uses, so the same YAML works with
// kubectl and in a tetherd config file; unknown fields are errors, as with kubectl's strict validation.
// In a cluster the API server has validated these objects already; tether's own meaning (the class, the
// annotations, the VIP) is checked for both sources by daemon/lb/lb-spec.ts.

type Schema = Record<string, unknown>;

const int = (min: number, max: number): Schema => ({ type: 'integer', minimum: min, maximum: max });
const labelMap: Schema = { type: 'object', additionalProperties: { type: 'string' } };
const metadata: Schema = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    namespace: { type: 'string' },
    labels: labelMap,
    annotations: labelMap,
    uid: { type: 'string' },
    resourceVersion: { type: 'string' },
    generation: { type: 'integer' },
    creationTimestamp: { type: 'string' },
    deletionTimestamp: { type: 'string' },
    ownerReferences: { type: 'array', items: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } },
    finalizers: { type: 'array', items: { type: 'string' } },
    managedFields: { type: 'array', items: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } },
  },
};

export const SERVICE_SCHEMA: Schema = {
  type: 'object',
  required: ['spec'],
  properties: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata,
    spec: {
      type: 'object',
      properties: {
        type: { type: 'string', enum: ['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName'] },
        loadBalancerClass: { type: 'string', maxLength: 253 },
        ports: {
          type: 'array',
          items: {
            type: 'object',
            required: ['port'],
            properties: {
              name: { type: 'string' },
              protocol: { type: 'string', enum: ['TCP', 'UDP', 'SCTP'] },
              appProtocol: { type: 'string' },
              port: int(1, 65535),
              targetPort: { 'x-kubernetes-int-or-string': true, anyOf: [{ type: 'integer' }, { type: 'string' }] },
              nodePort: int(0, 65535),
            },
          },
        },
        selector: labelMap,
        clusterIP: { type: 'string' },
        clusterIPs: { type: 'array', items: { type: 'string' } },
        externalIPs: { type: 'array', items: { type: 'string' } },
        ipFamilies: { type: 'array', items: { type: 'string', enum: ['IPv4', 'IPv6'] } },
        ipFamilyPolicy: { type: 'string', enum: ['SingleStack', 'PreferDualStack', 'RequireDualStack'] },
        sessionAffinity: { type: 'string', enum: ['None', 'ClientIP'] },
        sessionAffinityConfig: {
          type: 'object',
          properties: { clientIP: { type: 'object', properties: { timeoutSeconds: int(1, 86400) } } },
        },
        externalTrafficPolicy: { type: 'string', enum: ['Cluster', 'Local'] },
        internalTrafficPolicy: { type: 'string', enum: ['Cluster', 'Local'] },
        healthCheckNodePort: int(0, 65535),
        allocateLoadBalancerNodePorts: { type: 'boolean' },
        loadBalancerIP: { type: 'string' },
        loadBalancerSourceRanges: { type: 'array', items: { type: 'string' } },
        publishNotReadyAddresses: { type: 'boolean' },
      },
      'x-kubernetes-validations': [
        { rule: "!has(self.loadBalancerClass) || self.type == 'LoadBalancer'", message: 'loadBalancerClass may only be set on a Service of type LoadBalancer' },
        {
          rule: '(has(self.loadBalancerClass) && has(oldSelf.loadBalancerClass) && self.loadBalancerClass == oldSelf.loadBalancerClass) || (!has(self.loadBalancerClass) && !has(oldSelf.loadBalancerClass))',
          message: 'loadBalancerClass is immutable',
        },
      ],
    },
    status: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
  },
};

export const ENDPOINT_SLICE_SCHEMA: Schema = {
  type: 'object',
  required: ['addressType', 'endpoints'],
  properties: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata,
    addressType: { type: 'string', enum: ['IPv4', 'IPv6', 'FQDN'] },
    endpoints: {
      type: 'array',
      maxItems: 1000,
      items: {
        type: 'object',
        required: ['addresses'],
        properties: {
          addresses: { type: 'array', minItems: 1, maxItems: 100, items: { type: 'string' } },
          conditions: {
            type: 'object',
            properties: { ready: { type: 'boolean' }, serving: { type: 'boolean' }, terminating: { type: 'boolean' } },
          },
          hostname: { type: 'string' },
          nodeName: { type: 'string' },
          zone: { type: 'string' },
          targetRef: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
          hints: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
          deprecatedTopology: labelMap,
        },
      },
    },
    ports: {
      type: 'array',
      items: {
        type: 'object',
        properties: { name: { type: 'string' }, port: int(0, 65535), protocol: { type: 'string', enum: ['TCP', 'UDP', 'SCTP'] }, appProtocol: { type: 'string' } },
      },
    },
  },
};

/** Core kinds with a schema: their apiVersion, and whether they are namespaced. */
export const CORE_KINDS: Record<string, { apiVersion: string; schema: Schema; namespaced: boolean }> = {
  Service: { apiVersion: 'v1', schema: SERVICE_SCHEMA, namespaced: true },
  EndpointSlice: { apiVersion: 'discovery.k8s.io/v1', schema: ENDPOINT_SLICE_SCHEMA, namespaced: true },
};
