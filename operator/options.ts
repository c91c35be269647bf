// tether-operator's command line.
import { parseArgs } from 'node:util';
import * as os from 'node:os';

export const USAGE = `usage: tether-operator [options]
Runs the cluster's controllers (status of AddressPools, Egresses and tether Services, the Service label,
collection of deleted nodes' AddressBlocks, the cluster Secrets), one replica at a time: the holder of the
Lease tether-operator in its namespace ($POD_NAMESPACE, default tether-system).
  --kubernetes            in-cluster service account; --kubeconfig F a kubeconfig file instead
  --redis URL             the cluster store (nodes' health reports, Egress owners, VIPs); $TETHER_REDIS_URL
  --redis-prefix P        key prefix (default tether:)
  --redis-password-secret S  the store's password from Secret S (entry "password"), created when absent
  --cluster-key-secret S  the cluster key's Secret (entry "key"), created when absent
  --identity I            this replica's name in the Lease (default $POD_NAME, else the host name)
  --probe-port N          /livez and /readyz on N (default 0: none); --probe-address A (default 0.0.0.0)
  --metrics-bind-address IP:PORT  Prometheus metrics on http://IP:PORT/metrics (default empty: none;
                          the Deployment serves them on 0.0.0.0:10270, the pod's address)
  --lease-duration S      seconds (default 15)
  --log-level L           error, warn, info (default), debug`;

export interface OperatorOptions {
  kubernetes: boolean;
  kubeconfig?: string;
  redis?: string;
  'redis-prefix': string;
  'redis-password-secret'?: string;
  'cluster-key-secret'?: string;
  identity?: string;
  'probe-port': string;
  'probe-address': string;
  'metrics-bind-address': string;
  'lease-duration': string;
  'log-level': string;
  help?: boolean;
}

export function parseOperatorOptions(argv: string[]): OperatorOptions {
  const o = parseArgs({
    args: argv,
    options: {
      kubernetes: { type: 'boolean', default: false },
      kubeconfig: { type: 'string' },
      redis: { type: 'string', default: process.env.TETHER_REDIS_URL },
      'redis-prefix': { type: 'string', default: 'tether:' },
      'redis-password-secret': { type: 'string' },
      'cluster-key-secret': { type: 'string' },
      identity: { type: 'string' },
      'probe-port': { type: 'string', default: '0' },
      'probe-address': { type: 'string', default: '0.0.0.0' },
      'metrics-bind-address': { type: 'string', default: '' },
      'lease-duration': { type: 'string', default: '15' },
      'log-level': { type: 'string', default: 'info' },
      help: { type: 'boolean', short: 'h' },
    },
  }).values as OperatorOptions;
  if (!o.help && !o.kubernetes && o.kubeconfig === undefined) throw new Error('the operator needs the Kubernetes API: give --kubernetes or --kubeconfig');
  const d = Number(o['lease-duration']);
  if (!/^[0-9]+$/.test(o['lease-duration']) || d < 2 || d > 300) throw new Error(`--lease-duration ${JSON.stringify(o['lease-duration'])}: give whole seconds, 2 to 300`);
  return o;
}

export function identityOf(o: OperatorOptions): string {
  return o.identity ?? process.env.POD_NAME ?? os.hostname();
}
