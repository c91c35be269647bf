// The node registry in the cluster store: each tetherd publishes its node address in one field of one
// hash with its own expiry time, so a node that died drops out without anyone deleting it. Receivers of
// FoU (egress gateways, load balancer targets) accept it only from registered node addresses.
import type Redis from 'ioredis';

export async function registerNode(client: Redis, prefix: string, node: string, address: string, ttlMs: number): Promise<void> {
  await client.hset(`${prefix}nodes`, node, JSON.stringify({ address, expiresAt: Date.now() + ttlMs }));
}

/** Live registrations' addresses (node clocks are assumed roughly in sync, as NTP keeps them). */
export async function listNodes(client: Redis, prefix: string): Promise<string[]> {
  const now = Date.now();
  return Object.values(await client.hgetall(`${prefix}nodes`)).flatMap((v) => {
    try {
      const r = JSON.parse(v) as { address: string; expiresAt: number };
      return r.expiresAt > now ? [r.address] : [];
    } catch {
      return [];
    }
  });
}
