/**
 * `tooltx serve` — one process hosting the roles of a deployment (default: all four), each on its
 * own connection as its own identity. Co-located, the authorizer hands an operation it accepted and
 * started in one append straight to the executor of the same process (docs/operating.md "One
 * process or four"); every role still consumes its durables, so any mix of co-located and separate
 * processes, and any number of instances of each, work together when they run the same build.
 *
 * Usage: `tooltx serve [--roles all|<role>,<role>…] [--help]`; the environment of the roles it hosts
 * (`--help` lists it). Stops cleanly on SIGTERM/SIGINT: the authorizer first, the executor after its
 * in-flight attempts, then the projections; every connection drained.
 */
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { runRoles, type RoleSpec } from '@tooltx/runtime/service';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { auditProjectorRole } from '../services/audit-projector/src/role.js';
import { authorizerRole } from '../services/authorizer/src/role.js';
import { executorRole } from '../services/executor/src/role.js';
import { reconcilerRole } from '../services/reconciler/src/role.js';

/**
 * The roles in the order they start: the log's consumers first, the authorizer last (so that the
 * executor is there to take what it hands over); they stop in the reverse order.
 */
export const ROLES: readonly RoleSpec[] = [
  auditProjectorRole,
  reconcilerRole,
  executorRole,
  authorizerRole,
] as unknown as readonly RoleSpec[];
export const ROLE_NAMES = ROLES.map((r) => r.name);

/** The roles `list` names (`all`, or role names comma-separated), in start order; throws a usage message. */
export function rolesFrom(list: string): RoleSpec[] {
  const names = list
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
  if (names.length === 1 && names[0] === 'all') return [...ROLES];
  const unknown = names.filter((n) => !ROLE_NAMES.includes(n));
  if (unknown.length || names.length === 0)
    throw new Error(
      `--roles: expected all or a comma-separated list of ${ROLE_NAMES.join(', ')}; got ${JSON.stringify(list)}`,
    );
  return ROLES.filter((r) => names.includes(r.name));
}

/** Runs `tooltx serve` with `argv` (node, script, then the arguments). */
export async function serve(argv: string[]): Promise<void> {
  const pre = usageErrorsExitTwo(new Command('tooltx serve'))
    .option('--roles <list>', 'roles to host', process.env.TOOLTX_ROLES ?? 'all')
    .allowUnknownOption()
    .allowExcessArguments()
    .helpOption(false);
  pre.parse(argv);
  let roles: RoleSpec[];
  try {
    roles = rolesFrom(pre.opts<{ roles: string }>().roles);
  } catch (err) {
    process.stderr.write(`tooltx serve: ${(err as Error).message}\n`);
    process.exit(2);
  }
  await runRoles(roles, {
    program: 'tooltx-serve',
    summary: `hosts the roles of a deployment in one process (${ROLE_NAMES.join(', ')})`,
    argv,
    options: [
      {
        flags: '--roles <list>',
        description: `all, or a comma-separated list of ${ROLE_NAMES.join(', ')} (env TOOLTX_ROLES; default all)`,
      },
    ],
  });
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) await serve(process.argv);
