import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ContractRegistry, type Contract, type Implementation } from '@tooltx/contracts';

/** The trusted implementations of a deployment, by `name@version`. */
export class ImplementationRegistry {
  readonly contracts: ContractRegistry;
  readonly #byId = new Map<string, Implementation>();
  constructor(impls: Implementation[]) {
    this.contracts = new ContractRegistry(impls.map((i) => i.contract));
    for (const i of impls) this.#byId.set(i.contract.id, i);
  }
  get(tool: string, version: number): Implementation | undefined {
    return this.#byId.get(`${tool}@${version}`);
  }
  /** The longest time an operation may stay unresolved: running bound + unknown deadline, ms. */
  longestOperationMs(): number {
    return Math.max(
      0,
      ...this.contracts.all().map((c: Contract) => c.timing.runningBoundMs + c.timing.unknownDeadlineMs),
    );
  }
}

/** The tools module loaded but does not export what it must; the message names the path and the rule. */
export class ToolsModuleError extends TypeError {
  /** What is wrong, without the path. */
  readonly problem: string;
  constructor(path: string, problem: string) {
    super(`${path}: ${problem}`);
    this.name = 'ToolsModuleError';
    this.problem = problem;
  }
}

/**
 * Loads the trusted module named by `TOOLTX_TOOLS_MODULE` (the trusted side is never loaded
 * by agents). The module must export `implementations: Implementation[]`. Throws
 * {@link ToolsModuleError} (a `TypeError`) when the export is missing or malformed, and the import's
 * own error when the module cannot be loaded.
 */
export async function loadImplementations(path: string): Promise<ImplementationRegistry> {
  const abs = isAbsolute(path) ? path : resolve(process.cwd(), path);
  const mod = (await import(pathToFileURL(abs).href)) as { implementations?: unknown };
  const list = mod.implementations;
  if (!Array.isArray(list) || list.length === 0)
    throw new ToolsModuleError(path, 'must export a non-empty `implementations` array');
  for (const [i, impl] of list.entries()) {
    const x = impl as Partial<Implementation>;
    if (!x?.contract?.id || !x.contract.digest || typeof x.execute !== 'function') {
      throw new ToolsModuleError(path, `implementations[${i}] is not an Implementation (contract + execute)`);
    }
  }
  return new ImplementationRegistry(list as Implementation[]);
}
