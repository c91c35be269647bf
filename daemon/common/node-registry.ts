// The node registry in the cluster store: each tetherd publishes its node address in one field of one
// hash with its own expiry time, so a node that died drops out without anyone deleting it. Receivers of
// FoU (egress gateways, load balancer targets) accept it only from registered node addresses.
import type Redis from 'ioredis';
import { isCanonicalIp, isTime, parseObject, refuseRecord } from './store-record';

export async function registerNode(client: Redis, prefix: string, node: string, address: string, ttlMs: number): Promise<void> {
  await client.hset(`${prefix}nodes`, node, JSON.stringify({ address, expiresAt: Date.now() + ttlMs }));
}

/**
 * Live registrations' addresses (node clocks are assumed roughly in sync, as NTP keeps them). A garbled
 * registration is left out (one warn line): its address is never let through the FoU source filters.
 */
export async function listNodes(client: Redis, prefix: string): Promise<string[]> {
  const now = Date.now();
  const key = `${prefix}nodes`;
  return Object.entries(await client.hgetall(key)).flatMap(([node, v]) => {
    const { value: r, problem } = parseObject(v);
    const why = problem ?? (!isCanonicalIp(r!.address) ? 'address is not an IP address' : !isTime(r!.expiresAt) ? 'expiresAt is not a time' : undefined);
    if (why) {
      refuseRecord('node registry', key, node, why, v);
      return [];
    }
    return (r!.expiresAt as number) > now ? [r!.address as string] : [];
  });
}
