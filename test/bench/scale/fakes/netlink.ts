// Fake of daemon/netlink (index, handle): a handle whose every call is recorded; links exist with a fixed
// MTU so callers that read one go on. Errors and constants are the real ones.
import { record, recorder } from './record';

export { NetlinkError, isNetlinkError } from '../../../../daemon/netlink/netlink-error';
export { RT_SCOPE, RT_TABLE_MAIN, RT_TABLE_LOCAL, NUD, IFF_UP } from '../../../../daemon/netlink/constants';

const link = (name: unknown) => ({ name: String(name), index: 2, mtu: 1500, mac: '02:00:00:00:00:01', up: true, flags: 1 });
const answers = {
  getLink: link,
  requireLink: link,
  kernelHasDummy: () => true,
  listLinks: () => [],
  listAddresses: () => [],
  listRoutes: () => [],
  listRules: () => [],
  listNeighbours: () => [],
};

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export class NetlinkHandle {
  static open(): any {
    record('netlink.open');
    return recorder('netlink', answers);
  }
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  static with<T>(_ns: string | undefined, fn: (h: any) => T): T {
    return fn(recorder('netlink', answers));
  }
}

export class NetlinkSocket {
  constructor() {
    throw new Error('simulation: NetlinkSocket has no fake');
  }
}
