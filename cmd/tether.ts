// tether: the chained CNI plugin. A thin client: it refuses to run without prevResult (it must follow a
// primary plugin), forwards the request to the node's tetherd and prints the answer. All pod work happens
// in tetherd (daemon/pod).
import { DEFAULT_SOCKET_PATH } from '../lib/api/protocol';
import { DEFAULT_DELETE_QUEUE_DIR } from '../lib/api/delete-queue';
import { ErrorCode, TetherError } from '../lib/errors';
import { runCniClient, absolutePathField } from '../cni/client-main';

export function main(): Promise<number> {
  return runCniClient({
    methods: { ADD: 'cni.add', DEL: 'cni.del', CHECK: 'cni.check', STATUS: 'cni.status', GC: 'cni.gc' },
    validate(conf, command) {
      if ((command === 'ADD' || command === 'CHECK') && conf.prevResult === undefined) {
        throw new TetherError(ErrorCode.InvalidConfig, 'prevResult: missing; tether is a chained plugin and must follow a primary plugin in a conflist');
      }
    },
    socketPath: (conf) => absolutePathField(conf.socketPath, 'socketPath', DEFAULT_SOCKET_PATH),
    deleteQueueDir: (conf) => absolutePathField(conf.deleteQueueDir, 'deleteQueueDir', DEFAULT_DELETE_QUEUE_DIR),
  });
}
