/**
 * Where `web.fetch_page` may connect: public unicast addresses only (a fetch tool must not be a way
 * into the trusted network — the KB, nats-server's monitoring, a cloud metadata endpoint). Why
 * both checks: a check that compares the URL's host as text lets a name resolving to 127.0.0.1
 * (the machine's own hostname) and the spellings `[::]`, `[0:0:0:0:0:0:0:0]` reach local servers.
 *
 * Two checks, one rule ({@link isPublicAddress}):
 * - {@link checkLiteralHost} before the request, without DNS: a local name (`localhost`, …) or an
 *   address literal is classified as it is (node:net skips the socket's lookup for a literal).
 * - {@link publicOnlyLookup}, the lookup of {@link publicOnlyDispatcher}'s sockets: a name is
 *   resolved once, at connect time (node:dns `lookup`, every address of every family), refused when
 *   ANY address is not public, and the socket connects only to addresses that passed, so no answer
 *   can change between a check and the connection (DNS rebinding). The refusal reaches the caller
 *   as the fetch's `cause` ({@link PrivateAddressError}, {@link isPrivateAddressRefusal}).
 *
 * Not public (IANA special-purpose registries, RFC 6890 and its updates): IPv4 0/8, 10/8, 100.64/10,
 * 127/8, 169.254/16, 172.16/12, 192.0.0/24, 192.0.2/24, 192.88.99/24, 192.168/16, 198.18/15,
 * 198.51.100/24, 203.0.113/24, 224/4 (multicast), 240/4 (reserved, broadcast); IPv6 ::/128, ::1/128,
 * ::/96 (IPv4-compatible), ::ffff:0:0/96 (IPv4-mapped: classified by its IPv4 address), 64:ff9b::/96
 * (NAT64: by its IPv4 address), 64:ff9b:1::/48, 100::/64, 2001::/23, 2001:db8::/32, 2002::/16 (6to4),
 * 3fff::/20, fc00::/7 (unique local), fe80::/10 (link-local), fec0::/10 (site-local), ff00::/8 (multicast).
 */
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { BlockList, isIP } from 'node:net';
import { Agent } from 'undici';

const blocked = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const)
  blocked.addSubnet(net, bits, 'ipv4');
for (const [net, bits] of [
  ['::', 96],
  ['64:ff9b:1::', 48],
  ['100::', 64],
  ['2001::', 23],
  ['2001:db8::', 32],
  ['2002::', 16],
  ['3fff::', 20],
  ['fc00::', 7],
  ['fe80::', 10],
  ['fec0::', 10],
  ['ff00::', 8],
] as const)
  blocked.addSubnet(net, bits, 'ipv6');
// ::ffff:0:0/96 needs no rule of its own: BlockList checks an IPv4-mapped address against the IPv4 rules.

/** The 16 bytes of an IPv6 address (node:net `isIP` said 6), a trailing dotted quad included. */
function ipv6Bytes(address: string): number[] {
  let text = address.split('%')[0]!;
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (quad) {
    const [a, b, c, d] = quad.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, quad.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? (text.split('::') as [string, string]) : [text, undefined];
  const words = (s: string) => (s === '' ? [] : s.split(':').map((w) => parseInt(w, 16)));
  const h = words(head);
  const t = tail === undefined ? [] : words(tail);
  const all = tail === undefined ? h : [...h, ...Array<number>(8 - h.length - t.length).fill(0), ...t];
  return all.flatMap((w) => [w >> 8, w & 0xff]);
}

/**
 * Whether `address` (an IPv4 or IPv6 literal, without brackets; a zone id is ignored) is a public
 * unicast address this tool may connect to. Anything that is not an address literal is not public.
 */
export function isPublicAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return !blocked.check(address, 'ipv4');
  if (family !== 6) return false;
  const bare = address.split('%')[0]!;
  if (blocked.check(bare, 'ipv6')) return false;
  const b = ipv6Bytes(bare);
  // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits: that one decides.
  if (b.slice(0, 12).join(',') === [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0].join(','))
    return isPublicAddress(b.slice(12).join('.'));
  return true;
}

/** The URL host as an address literal: `[::1]` → `::1`; a name stays a name. */
function bareHost(hostname: string): string {
  return hostname.startsWith('[') && hostname.endsWith(']') ? hostname.slice(1, -1) : hostname;
}

/** A name that is local by definition (RFC 6761 `localhost`), whatever the resolver says. */
function isLocalName(host: string): boolean {
  const h = host.toLowerCase().replace(/\.$/, '');
  return h === 'localhost' || h.endsWith('.localhost');
}

/** A connection refused because its host is or resolves to an address that is not public. */
export class PrivateAddressError extends Error {
  readonly code = 'private_address';
  constructor(readonly host: string) {
    super('the host is or resolves to a loopback, private, link-local or otherwise non-public address');
    this.name = 'PrivateAddressError';
  }
}

/** Every address `host` resolves to (all families, as the resolver orders them). */
function resolveAll(host: string): Promise<LookupAddress[]> {
  return new Promise((resolve, reject) =>
    dnsLookup(host, { all: true, verbatim: true }, (err, addresses) => (err ? reject(err) : resolve(addresses))),
  );
}

/**
 * Classifies `hostname` (a WHATWG URL's `hostname`: brackets around IPv6) without DNS: throws
 * {@link PrivateAddressError} for a local name or a non-public address literal; returns for a
 * public literal and for any other name (resolved and checked at connect time by
 * {@link publicOnlyLookup}).
 */
export function checkLiteralHost(hostname: string): void {
  const host = bareHost(hostname);
  if (isLocalName(host) || (isIP(host) && !isPublicAddress(host))) throw new PrivateAddressError(host);
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/**
 * A node:net `lookup` (the `lookup` socket option) that resolves `hostname` and answers only when
 * every address it resolves to is public; else it fails with {@link PrivateAddressError}. It answers
 * with the addresses it checked (of the family asked for), so the socket connects to one of those.
 */
export function publicOnlyLookup(
  hostname: string,
  options: { family?: number | string; all?: boolean },
  callback: LookupCallback,
): void {
  const host = bareHost(hostname);
  const refuse = () => callback(new PrivateAddressError(host), options.all ? [] : '', 0);
  if (isLocalName(host)) {
    refuse();
    return;
  }
  resolveAll(host).then(
    (addresses) => {
      if (addresses.length === 0 || addresses.some((a) => !isPublicAddress(a.address))) return refuse();
      const family = options.family === 'IPv4' ? 4 : options.family === 'IPv6' ? 6 : Number(options.family ?? 0);
      const usable = family === 4 || family === 6 ? addresses.filter((a) => a.family === family) : addresses;
      if (usable.length === 0) {
        const err: NodeJS.ErrnoException = Object.assign(new Error(`no IPv${family} address`), { code: 'ENOTFOUND' });
        return callback(err, options.all ? [] : '', 0);
      }
      if (options.all) callback(null, usable);
      else callback(null, usable[0]!.address, usable[0]!.family);
    },
    (err: NodeJS.ErrnoException) => callback(err, options.all ? [] : '', 0),
  );
}

/**
 * The dispatcher of every fetch to an origin not in `WEB_ALLOWED_ORIGINS`: its sockets resolve
 * through {@link publicOnlyLookup}. A fetch refused by it rejects with a `TypeError` whose `cause`
 * is a {@link PrivateAddressError} (nothing was sent).
 */
export const publicOnlyDispatcher = new Agent({ connect: { lookup: publicOnlyLookup as never } });

/** Whether `err` (a fetch's rejection) is the connect-time refusal of {@link publicOnlyDispatcher}. */
export function isPrivateAddressRefusal(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++)
    if (e instanceof PrivateAddressError) return true;
  return false;
}
