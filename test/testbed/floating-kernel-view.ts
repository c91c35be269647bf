// The pure part of the floating-address sampler (floating-sampler.ts), in both families: which floating
// addresses a gateway pod's SNAT rules name, from `nft -a monitor` and `nft -a list table` text of its
// `ip tether_egress` and `ip6 tether_egress` tables, and which addresses a node answers for on its uplink
// (a proxy ARP / proxy NDP entry while a /32 / /128 route sends the address to another link).
import { canonicalIp, type IpFamily } from '../../lib/ip';
import { inCidr } from './topology';

/** The floating pools the sampler reads, per family (an IPv6 one only when the testbed has IPv6). */
export interface FloatingPools {
  4: string;
  6?: string;
}

/** The pool an address belongs to, by family; undefined when it is in none of them. */
export function poolFamily(address: string, pools: FloatingPools): IpFamily | undefined {
  if (inCidr(address, pools[4])) return 4;
  if (pools[6] && inCidr(address, pools[6])) return 6;
  return undefined;
}

const NFT_FAMILY: Record<string, IpFamily> = { ip: 4, ip6: 6 };
const TABLE = 'tether_egress';
const IPV4 = /\b(\d+\.\d+\.\d+\.\d+)\b/g;
// At least two colons (so the " : " of a map is not one); checked as an address by the pool filter.
const IPV6 = /(?<![\w:.])([0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7})(?![\w:])/gi;

/**
 * The SNAT rules of a gateway pod's tether_egress tables, fed line by line: the listing of a table (its
 * rules carry no family: the `table ip6 tether_egress {` line before them says which) and the monitor's
 * add and delete lines. Rule handles are per table, so the IPv4 and IPv6 tables' handles overlap: rules are
 * kept by family and handle. Only the postrouting chain's rules count (the SNAT chain); addresses outside
 * the family's pool are passed over.
 */
export class NftSnatRules {
  /** "<family> <handle>" → floating addresses its SNAT names */
  private readonly rules = new Map<string, string[]>();
  /** The table being listed (between its `table … {` line and its closing `}`), and its chain. */
  private listing?: { family: IpFamily; chain?: string };

  constructor(private readonly pools: FloatingPools) {}

  /** One line of nft's output. */
  line(line: string): void {
    // The monitor's lines first: they may come between a listing's lines (two processes, one pipe).
    const del = new RegExp(`^delete rule (ip6?) ${TABLE} postrouting handle (\\d+)`).exec(line);
    if (del) {
      this.rules.delete(`${NFT_FAMILY[del[1]]} ${del[2]}`);
      return;
    }
    // The table deleted (a test may delete one): its rules go.
    const gone = new RegExp(`^delete table (ip6?) ${TABLE}\\b`).exec(line);
    if (gone) {
      for (const k of [...this.rules.keys()]) if (k.startsWith(`${NFT_FAMILY[gone[1]]} `)) this.rules.delete(k);
      return;
    }
    if (/^(add|delete|insert|replace) /.test(line)) {
      const add = new RegExp(`^add rule (ip6?) ${TABLE} postrouting .*# handle (\\d+)\\s*$`).exec(line);
      if (add && line.includes('snat to')) this.set(NFT_FAMILY[add[1]], Number(add[2]), line);
      return;
    }
    // A listing: its rules carry no family or chain; the `table …` and `chain …` lines before them say which.
    const table = new RegExp(`^table (ip6?) ${TABLE} \\{`).exec(line);
    if (table) {
      this.listing = { family: NFT_FAMILY[table[1]] };
      return;
    }
    if (!this.listing) return;
    if (line === '}') {
      this.listing = undefined;
      return;
    }
    const chain = /^\s*chain (\S+) \{/.exec(line);
    if (chain) {
      this.listing.chain = chain[1];
      return;
    }
    const handle = /# handle (\d+)\s*$/.exec(line);
    if (this.listing.chain === 'postrouting' && handle && line.includes('snat to')) this.set(this.listing.family, Number(handle[1]), line);
  }

  /** Every floating address some rule names now (each once). */
  addresses(): string[] {
    return [...new Set([...this.rules.values()].flat())];
  }

  private set(family: IpFamily, handle: number, line: string): void {
    const after = line.slice(line.indexOf('snat to'));
    const found = family === 4 ? [...after.matchAll(IPV4)].map((m) => m[1]) : [...after.matchAll(IPV6)].map((m) => m[1]);
    const addrs = found.filter((a) => poolFamily(a, this.pools) === family).map(canonicalIp);
    this.rules.set(`${family} ${handle}`, [...new Set(addrs)]);
  }
}

/**
 * The floating addresses of `family` a node answers for on its uplink: those with a proxy neighbour entry
 * there that the node also routes (a /32 or /128, main table) through another link — the kernel answers for
 * a proxy entry only then.
 */
export function announcedOnUplink(
  family: IpFamily,
  proxied: Array<{ address: string; index: number }>,
  routes: Array<{ dst: string; dstLen: number; index?: number }>,
  uplink: number,
  pools: FloatingPools,
): string[] {
  const bits = family === 4 ? 32 : 128;
  const inPool = (a: string) => poolFamily(a, pools) === family;
  const routed = new Set(routes.filter((r) => r.dstLen === bits && r.index !== undefined && r.index !== uplink && inPool(r.dst)).map((r) => canonicalIp(r.dst)));
  return proxied.filter((x) => x.index === uplink && inPool(x.address)).map((x) => canonicalIp(x.address)).filter((a) => routed.has(a));
}
