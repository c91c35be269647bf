import { LB_CLASS } from '../../daemon/objects/names';
// Test objects for the load balancer: n tether Services (svc-0…) in namespace shop, each with one
// EndpointSlice whose single ready target runs on the node `nodeOf(i)` names.

export function lbServiceObjects(n: number, nodeOf: (i: number) => string): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  for (let i = 0; i < n; i++) {
    const name = `svc-${i}`;
    out.push({
      apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: 'shop' },
      spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] },
    });
    out.push({
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-x`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } },
      addressType: 'IPv4', endpoints: [{ addresses: [`10.244.${i >> 8}.${(i & 255) || 1}`], conditions: { ready: true }, nodeName: nodeOf(i) }],
    });
  }
  return out;
}
