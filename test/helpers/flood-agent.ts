/**
 * A flooding agent in a process of its own (so that its publishing does not slow the process that
 * measures the other tenants): publishes on its own intent subject as fast as one connection can.
 * Environment: FLOOD_URL, FLOOD_SEED, FLOOD_PREFIX, FLOOD_TENANT, FLOOD_ACTOR, FLOOD_KIND
 * (`amplifiers` | `junk` | `valid`), FLOOD_MS (how long) or FLOOD_MAX_BYTES, FLOOD_WINDOW
 * (publishes in flight). Prints one JSON line, the {@link FloodRun}, and exits 0.
 */
import { amplifier, floodWith, validIntent } from './tenancy.js';

const env = process.env;
const kind = env.FLOOD_KIND ?? 'junk';
const amp = amplifier(1, 25_000);
const junk = new Uint8Array(1_000_000).fill(0xc1);
const next = kind === 'amplifiers' ? () => amp : kind === 'valid' ? validIntent : () => junk;
const end = env.FLOOD_MS ? performance.now() + Number(env.FLOOD_MS) : Infinity;
const run = await floodWith(
  {
    url: env.FLOOD_URL!,
    ...(env.FLOOD_SEED ? { seedFile: env.FLOOD_SEED } : {}),
    prefix: env.FLOOD_PREFIX!,
    tenant: env.FLOOD_TENANT!,
    actor: env.FLOOD_ACTOR!,
  },
  next,
  {
    until: () => performance.now() >= end,
    ...(env.FLOOD_MAX_BYTES ? { maxBytes: Number(env.FLOOD_MAX_BYTES) } : {}),
    window: Number(env.FLOOD_WINDOW ?? 64),
  },
);
process.stdout.write(`${JSON.stringify(run)}\n`);
