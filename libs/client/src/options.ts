import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { fieldIssues, ID_PATTERN, type Contract, type FieldIssue } from '@tooltx/contracts';
import { trustedReceiptKeys } from '@tooltx/lifecycle';
import type { NatsConnection } from '@tooltx/nats';

/** Options of {@link createTools}. Give `servers` (the SDK connects and owns the connection) or `nc`. */
export interface CreateToolsOptions {
  servers?: string;
  nc?: NatsConnection;
  /** The tenant and actor this agent authenticates as; the server checks them against its identity. */
  tenant: string;
  actor: string;
  /** The contracts this agent may call (the shared half: schemas, normalisers, key rules). */
  contracts: Contract[];
  /** Subject prefix (default `tooltx`). */
  prefix?: string;
  /** Credentials file, when connecting with `servers`. */
  credsFile?: string;
  /** Nkey seed file, when connecting with `servers` (`tooltx auth generate` writes one per actor). */
  nkeyFile?: string;
  /** Inbox prefix for replies (default `_INBOX.<tenant>.<actor>`): the only subjects this agent subscribes to. */
  inboxPrefix?: string;
  /** Default per-call budget, ms (default 30 000). */
  budgetMs?: number;
  /**
   * Makes submission ids (Nats-Msg-Id); default random UUIDs, which no one else can predict.
   * Only tests and replay tools should set it.
   */
  submissionIdFactory?: () => string;
  /**
   * The receipt keys this agent trusts (FM-17): `{ "<keyId>": "<SPKI PEM>" }`, or the path
   * of such a JSON file (`tooltx auth generate` writes `receipt-keys.json`); default the file named
   * by `TOOLTX_RECEIPT_KEYS_FILE`. Required: a committed answer counts only with a receipt signed
   * under exactly one of these key ids.
   */
  receiptKeys?: Record<string, string> | string;
}

/**
 * One tool call, as the agent states it. `actorId`, when given, must be the authenticated actor.
 *
 * Field paths: every `issues[].path` of a refusal `execute` returns is relative to the object the
 * caller passed — this request (`["taskId"]`, `["actorId"]`, `["input", "items", 3, "body"]`) or, for
 * a bad option, the options object (`["budgetMs"]`). Errors `createTools` throws name the option
 * (`["nkeyFile"]`, `["contracts", 1]`).
 */
export interface ExecuteRequest {
  tool: string;
  /** Contract version; may be omitted when exactly one version of `tool` was given to createTools. */
  version?: number;
  taskId: string;
  /** The key the caller holds, if any; the server derives it again and refuses a mismatch. */
  operationKey?: string;
  actorId?: string;
  input: unknown;
}

export interface ExecuteOptions {
  /** How long this call may take before it returns `unknown`, ms. */
  budgetMs?: number;
}

/**
 * The shape of `execute`'s arguments: programming errors come back as `invalid_input` with a path
 * relative to the argument that holds the field (the request, or the options object).
 */
const executeRequestSchema = z.strictObject({
  // Strict: a misspelt or extra field (`versoin`, `tenant`) is a caller's bug, never ignored.
  tool: z.string().min(1).max(100),
  version: z.number().int().min(1).optional(),
  taskId: z.string().min(1).max(256),
  operationKey: z.string().max(100).optional(),
  actorId: z.string().max(64).optional(),
  input: z.unknown(),
});
const budgetSchema = z
  .number()
  .int()
  .min(100)
  .max(24 * 3600_000);
const executeOptionsSchema = z.strictObject({ budgetMs: budgetSchema.optional() });

/** The field issues of `execute`'s arguments (paths relative to the request or the options object); empty when both are well formed. */
export function executeArgumentIssues(req: ExecuteRequest, o: ExecuteOptions | undefined): FieldIssue[] {
  const r = executeRequestSchema.safeParse(req);
  const ro = executeOptionsSchema.safeParse(o ?? {});
  return [...(r.success ? [] : fieldIssues(r.error)), ...(ro.success ? [] : fieldIssues(ro.error))];
}

/** The options of {@link createTools}; a problem is a {@link ToolsOptionError} at the option's name. */
const createToolsOptionsSchema = z.strictObject({
  servers: z.string().min(1).optional(),
  nc: z
    .custom<NatsConnection>(
      (v) => typeof v === 'object' && v !== null && typeof (v as { request?: unknown }).request === 'function',
      'must be a NatsConnection',
    )
    .optional(),
  tenant: z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$'),
  actor: z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$'),
  contracts: z
    .array(
      z.custom<Contract>(
        (v) => typeof v === 'object' && v !== null && typeof (v as { id?: unknown }).id === 'string',
        'must be a contract (defineContract)',
      ),
    )
    .min(1),
  prefix: z
    .string()
    .regex(/^[a-z][a-z0-9_]{0,31}$/, 'must match ^[a-z][a-z0-9_]{0,31}$')
    .optional(),
  credsFile: z.string().min(1).optional(),
  nkeyFile: z.string().min(1).optional(),
  inboxPrefix: z.string().min(1).optional(),
  budgetMs: budgetSchema.optional(),
  submissionIdFactory: z.custom<() => string>((v) => typeof v === 'function', 'must be a function').optional(),
  receiptKeys: z.union([z.record(z.string(), z.string()), z.string().min(1)]).optional(),
});

/**
 * A bad option of {@link createTools} (a `TypeError`: a programming or configuration error, thrown
 * before anything is connected). `issues[].path` starts with the option's name (`["nkeyFile"]`,
 * `["contracts", 1]`, `["receiptKeys"]`); the message names the option and, for a file, its path.
 */
export class ToolsOptionError extends TypeError {
  readonly issues: FieldIssue[];
  constructor(issues: FieldIssue[]) {
    super(`createTools: ${issues.map((i) => `${i.path.join('.') || '(options)'}: ${i.message}`).join('; ')}`);
    this.name = 'ToolsOptionError';
    this.issues = issues;
  }
}

/**
 * Checks the options of {@link createTools} before anything is connected, and loads the trusted
 * receipt keys. Throws {@link ToolsOptionError}: a bad option, two contracts with one
 * `name@version`, an unreadable `nkeyFile`/`credsFile`, receipt keys that cannot be loaded.
 */
export function checkedOptions(opts: CreateToolsOptions): { trusted: ReturnType<typeof trustedReceiptKeys> } {
  const parsed = createToolsOptionsSchema.safeParse(opts);
  if (!parsed.success) throw new ToolsOptionError(fieldIssues(parsed.error));
  checkDistinctContracts(opts.contracts);
  const trusted = loadTrustedKeys(opts.receiptKeys);
  for (const option of ['nkeyFile', 'credsFile'] as const) checkReadable(option, opts[option]);
  return { trusted };
}

/** Throws {@link ToolsOptionError} at `contracts[i]` for a second contract with one `name@version`. */
function checkDistinctContracts(contracts: Contract[]): void {
  const seen = new Map<string, number>();
  contracts.forEach((c, i) => {
    const first = seen.get(c.id);
    if (first !== undefined)
      throw new ToolsOptionError([
        {
          path: ['contracts', i],
          code: 'duplicate',
          message: `${c.id} is given twice (also contracts[${first}]); give each name@version once`,
        },
      ]);
    seen.set(c.id, i);
  });
}

/** Throws {@link ToolsOptionError} naming `option` and the path when the file cannot be read. */
function checkReadable(option: 'nkeyFile' | 'credsFile', path: string | undefined): void {
  if (path === undefined) return;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ToolsOptionError([
      {
        path: [option],
        code: 'unreadable',
        message: `cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? String(err)})`,
      },
    ]);
  }
  if (option === 'nkeyFile' && !/^SU[A-Z2-7]{50,}$/.test(text.trim())) {
    throw new ToolsOptionError([
      {
        path: [option],
        code: 'not_a_seed',
        message: `${path} does not hold a user nkey seed (SU…; \`tooltx auth generate\` writes one per actor)`,
      },
    ]);
  }
}

const receiptKeysFileSchema = z.record(z.string(), z.string());

/**
 * The trusted receipt keys from the option, else the file named by TOOLTX_RECEIPT_KEYS_FILE. Throws
 * {@link ToolsOptionError} at `receiptKeys` naming the option or variable and the file's path: none
 * given, unreadable, not JSON, not `{ keyId: PEM }`, a key that is not a matching Ed25519 key, none trusted.
 */
function loadTrustedKeys(o: Record<string, string> | string | undefined) {
  const fromEnv = o === undefined;
  const src = o ?? process.env.TOOLTX_RECEIPT_KEYS_FILE;
  const fail = (message: string) =>
    new ToolsOptionError([{ path: ['receiptKeys'], code: 'invalid_receipt_keys', message }]);
  if (src === undefined || src === '')
    throw fail('receiptKeys (or TOOLTX_RECEIPT_KEYS_FILE) is required: the receipt keys this agent trusts');
  const where =
    typeof src === 'string' ? `${fromEnv ? 'TOOLTX_RECEIPT_KEYS_FILE' : 'receiptKeys'} file ${src}` : 'receiptKeys';
  let keys: unknown = src;
  if (typeof src === 'string') {
    let text: string;
    try {
      text = readFileSync(src, 'utf8');
    } catch (err) {
      throw fail(`cannot read ${where} (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    }
    try {
      keys = JSON.parse(text);
    } catch {
      throw fail(`${where} is not JSON; \`tooltx auth generate\` writes receipt-keys.json`);
    }
  }
  const shape = receiptKeysFileSchema.safeParse(keys);
  if (!shape.success) throw fail(`${where} must be a JSON object { "<keyId>": "<SPKI PEM>" }`);
  let trusted: ReturnType<typeof trustedReceiptKeys>;
  try {
    trusted = trustedReceiptKeys(shape.data);
  } catch (err) {
    throw fail(`${where}: ${(err as Error).message}`);
  }
  if (trusted.size === 0) throw fail(`${where}: no receipt key is trusted (the object is empty)`);
  return trusted;
}
