/**
 * Seeding the research-KB store (./kb-store.ts) at start-up: the tenant list with its quotas and
 * the knowledge bases with their aliases, members and state. Two sources, both applied on every
 * start, both "create if absent" for knowledge bases (an existing knowledge base — by tenant and
 * name — is left exactly as it is, so operator changes survive a restart):
 *
 * - `KB_SEED_FILE`: a JSON file, schema {@link seedFileSchema}:
 *   ```json
 *   { "tenants": [{ "id": "acme", "quota": 10000 }],
 *     "knowledgeBases": [{ "tenant": "acme", "name": "research", "aliases": ["Research-Notes"],
 *                          "members": [{ "actor": "alice", "role": "writer" }], "state": "active" }] }
 *   ```
 *   A tenant's `quota` (notes per UTC day, counted per TENANT over all its knowledge bases; `null`
 *   or absent = unlimited) is (re)set on every start; its counter is kept. A knowledge base's
 *   `defaultRole` (role of every actor of the owner tenant without a member entry) defaults to
 *   `null` — nobody — so a file never grants more than it says.
 * - `KB_SEED`: comma-separated `tenant:kb` or `tenant:kb:actor1+actor2` entries. With actors, each
 *   listed actor is a `writer` member and nobody else has a role; WITHOUT actors, every actor of the
 *   owner tenant is a writer (default role `writer`) — the behaviour of knowledge bases made before roles existed. Tenants named
 *   only here have no quota.
 *
 * The sample's tenant list is `examples/research-kb/tenants.json` (a `KB_SEED_FILE` with tenants
 * only): `npm start`, the demo, the bench (all through dev/src/stack.ts, which refuses to start when a
 * tenant of the identity list is missing from it) and docker-compose.yml give it to the KB, so their
 * knowledge bases come from `KB_SEED` and their quotas from that list.
 */
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { KB_NAME, KB_ROLES, KB_STATES, MAX_ALIAS, type KbSpec, type KbStore } from './kb-store.js';

const NAME_RULE = 'must match ^[a-z0-9_-]{1,64}$';
const name = z.string().regex(KB_NAME, NAME_RULE);
const role = z.enum(KB_ROLES);

/** The `KB_SEED_FILE` document. */
export const seedFileSchema = z.strictObject({
  tenants: z.array(z.strictObject({ id: name, quota: z.number().int().min(0).nullable().optional() })).default([]),
  knowledgeBases: z
    .array(
      z.strictObject({
        tenant: name,
        name,
        aliases: z.array(z.string().min(1).max(MAX_ALIAS)).default([]),
        members: z.array(z.strictObject({ actor: name, role })).default([]),
        defaultRole: role.nullable().default(null),
        state: z.enum(KB_STATES).default('active'),
      }),
    )
    .default([]),
});
/** A seed file as written (optional fields may be left out). */
export type KbSeedFile = z.input<typeof seedFileSchema>;
/** A seed after parsing: the tenants' quotas and the knowledge bases to create if absent. */
export interface KbSeed {
  tenants: { id: string; quota: number | null }[];
  knowledgeBases: KbSpec[];
}

/** A seed that cannot be used; `problems` lists every one. */
export class SeedError extends Error {
  readonly problems: string[];
  constructor(problems: string[]) {
    super(`invalid seed:\n  - ${problems.join('\n  - ')}`);
    this.name = 'SeedError';
    this.problems = problems;
  }
}

/**
 * `KB_SEED` as a zod schema (for the server's config): comma-separated `tenant:kb[:a+b]` items,
 * empty items ignored.
 */
export const seedPairsSchema = z
  .string()
  .default('')
  .transform((s, ctx) => {
    const out: KbSpec[] = [];
    for (const item of s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean)) {
      const [tenant, kb, actors, ...rest] = item.split(':');
      const list = actors === undefined ? undefined : actors.split('+');
      if (
        rest.length ||
        !tenant ||
        !kb ||
        !KB_NAME.test(tenant) ||
        !KB_NAME.test(kb) ||
        (list && !list.every((a) => KB_NAME.test(a)))
      ) {
        ctx.addIssue({
          code: 'custom',
          message: `"${item}" is not tenant:kb or tenant:kb:actor1+actor2 (each ${NAME_RULE})`,
        });
        continue;
      }
      out.push(
        list === undefined
          ? { tenant, name: kb, defaultRole: 'writer' }
          : { tenant, name: kb, defaultRole: null, members: list.map((actor) => ({ actor, role: 'writer' as const })) },
      );
    }
    return out;
  });

/** Reads and validates a `KB_SEED_FILE`; throws {@link SeedError} listing every problem. */
export function loadSeedFile(path: string): KbSeed {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8')) as unknown;
  } catch (err) {
    throw new SeedError([
      `KB_SEED_FILE: cannot read ${path} as JSON (${(err as NodeJS.ErrnoException).code ?? (err as Error).name})`,
    ]);
  }
  return parseSeed(raw);
}

/** Validates a seed document; throws {@link SeedError} listing every problem. */
export function parseSeed(raw: unknown): KbSeed {
  const r = seedFileSchema.safeParse(raw);
  if (!r.success)
    throw new SeedError(r.error.issues.map((i) => `KB_SEED_FILE: ${i.path.join('.') || '(root)'}: ${i.message}`));
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const t of r.data.tenants) {
    if (seen.has(t.id)) problems.push(`KB_SEED_FILE: tenant ${t.id} listed twice`);
    seen.add(t.id);
  }
  if (problems.length) throw new SeedError(problems);
  return {
    tenants: r.data.tenants.map((t) => ({ id: t.id, quota: t.quota ?? null })),
    knowledgeBases: r.data.knowledgeBases,
  };
}

/**
 * Applies `seed` to `store`: sets every listed tenant's quota, then creates the knowledge bases that
 * are absent. Returns how many knowledge bases were listed and created. Throws {@link SeedError}
 * when a knowledge base cannot be created (e.g. an alias taken by another one).
 */
export function applySeed(store: KbStore, seed: KbSeed): { knowledgeBases: number; created: number } {
  for (const t of seed.tenants) store.setTenantQuota(t.id, t.quota);
  let created = 0;
  const problems: string[] = [];
  for (const kb of seed.knowledgeBases) {
    try {
      if (store.createKnowledgeBase(kb).created) created++;
    } catch (err) {
      problems.push((err as Error).message);
    }
  }
  if (problems.length) throw new SeedError(problems);
  return { knowledgeBases: seed.knowledgeBases.length, created };
}
