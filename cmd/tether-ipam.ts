// tether-ipam: the CNI IPAM plugin, run by a primary plugin (ptp, bridge…) with the primary's config.
// A thin client like `tether`: it checks the `ipam` section's shape and forwards to tetherd, which owns
// the pools, the node's blocks and the allocations (ipam/pod-allocator.ts).
import { DEFAULT_SOCKET_PATH } from '../lib/api/protocol';
import { DEFAULT_DELETE_QUEUE_DIR } from '../lib/api/delete-queue';
import { ErrorCode, TetherError } from '../lib/errors';
import { runCniClient, absolutePathField } from '../cni/client-main';

export function main(): Promise<number> {
  return runCniClient({
    methods: { ADD: 'ipam.add', DEL: 'ipam.del', CHECK: 'ipam.check', STATUS: 'cni.status', GC: 'ipam.gc' },
    validate(conf, command) {
      if (command === 'STATUS' || command === 'GC') return;
      const ipam = conf.ipam as Record<string, unknown> | undefined;
      if (!ipam || typeof ipam !== 'object' || Array.isArray(ipam)) throw new TetherError(ErrorCode.InvalidConfig, 'ipam: missing or not an object');
      if (command !== 'DEL' && (typeof ipam.pool !== 'string' || !ipam.pool)) {
        throw new TetherError(ErrorCode.InvalidConfig, 'ipam.pool: missing or not a string (name an AddressPool of usage "pod")');
      }
    },
    socketPath: (conf) => {
      const ipam = (conf.ipam ?? {}) as Record<string, unknown>;
      return absolutePathField(ipam.socketPath, 'ipam.socketPath', DEFAULT_SOCKET_PATH);
    },
    // The primary's DEL releases the pod's address in tetherd's allocator: queued like tether's own.
    deleteQueueDir: (conf) => {
      const ipam = (conf.ipam ?? {}) as Record<string, unknown>;
      return absolutePathField(ipam.deleteQueueDir, 'ipam.deleteQueueDir', DEFAULT_DELETE_QUEUE_DIR);
    },
  });
}
