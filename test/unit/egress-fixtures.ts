// One Egress and its floating address, as the egress unit tests that drive the controller's real parts use them.
import type { ResolvedEgress } from '../../daemon/egress/egress-spec';

export const EGRESS: ResolvedEgress = {
  key: 'shop/out', name: 'out', namespace: 'shop',
  clients: { matchLabels: { app: 'web' } }, gateways: { matchLabels: { app: 'gw' } },
  families: [4], destinations: ['203.0.113.0/24'], excluded: [], addresses: [{ pool: 'float', count: 1 }], zonePolicy: 'any',
  failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
};
export const ADDRESS = '198.51.100.7';
