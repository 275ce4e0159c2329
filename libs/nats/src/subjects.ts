import { ID_PATTERN } from '@tooltx/contracts';

const OPID = /^[0-9a-f]{32}$/;
const SUBMISSION_TOKEN = /^[A-Za-z0-9_-]{1,128}$/;

/**
 * Every subject and stream name tooltx uses, under one prefix.
 * Subjects are built and parsed with an exact token count, and every id token must match
 * `^[a-z0-9_-]{1,64}$`, so `tenant a + actor b.c` can never equal `tenant a.b + actor c` and a
 * wildcard can never be an id.
 *
 * | subject | holds |
 * | --- | --- |
 * | `<p>.intent.<tenant>.<actor>` | intent envelopes (the tenant's own stream `<P>_INTENTS_<tenant>`) |
 * | `<p>.op.<tenant>.<opId>` | every lifecycle event of one operation (stream `<P>_EVENTS`) |
 * | `<p>.decision.<tenant>.<opId>.<actor>` | pre-acceptance outcomes, per actor (the tenant's own stream `<P>_DECISIONS_<tenant>`) |
 * | `<p>.status.<tenant>.<actor>` | status requests (request/reply, no stream) |
 * | `<p>.push.<tenant>.<actor>.<submissionId>` | the final answer to one submission, pushed to its agent (core NATS, no stream) |
 * | KV `<p>_tenants`, key `<tenant>` | the tenants of the deployment and their limits (docs/tenancy.md) |
 * | KV `<p>_results`, key `<tenant>.<opId>` | business results (result store) |
 * | KV `<p>_reconcile`, key `<tenant>.<opId>` | the reconciler's index of non-terminal operations (projection) |
 * | KV `<p>_audit`, key `<tenant>.<opId>` | one audit record per operation (projection) |
 * | `<p>.ops.compensate.<operator>` | operators' compensation requests to the authorizer (request/reply, no stream) |
 * | `<p>.ops.confirm.<operator>`, `<p>.ops.discard.<operator>` | operators' confirmations and discards of held-back operations to the authorizer (request/reply, no stream) |
 * | KV `<p>_contracts`, keys `version.<name>.<version>`, `current.<name>` | the contract registry (docs/contracts.md) |
 * | `<p>.ops.contracts.<operator>` | operators' contract registry commands and usage queries to the audit-projector (request/reply, no stream) |
 * | `<p>.ops.query.<operator>` | operators' queries of operations across tenants to the operations query service (request/reply, no stream) |
 * | `<p>.audit.<tenant>.<auditor>` | auditors' queries to the audit service (request/reply, no stream) |
 * | `<p>.auditlog.<tenant>.<auditor>` | the audit service's record of each query and export (stream `<P>_AUDITLOG`) |
 * | `<p>.ops.debug.<operator>` | operators' debug-sampling requests to the executor's debug service (request/reply, no stream) |
 * | `<p>.auditlog._debug.<operator>` | the debug service's record of each sampling switch and sample read (stream `<P>_AUDITLOG`) |
 * | KV `<p>_sampling`, key `<contract token>` | debug-sampling switches (docs/debug-samples.md) |
 * | KV `<p>_samples`, key `<contract token>.<tenant>.<opId>` | debug samples, scrubbed, expiring (docs/debug-samples.md) |
 */
export class Subjects {
  readonly prefix: string;
  constructor(prefix: string) {
    if (!/^[a-z][a-z0-9_]{0,31}$/.test(prefix)) throw new TypeError(`invalid subject prefix ${JSON.stringify(prefix)}`);
    this.prefix = prefix;
  }

  /**
   * One tenant's intake stream: its intents alone, so that its bounds, its backlog and the
   * sequence numbers its agents see are its own (docs/tenancy.md).
   */
  intentsStream(tenant: string): string {
    return `${this.prefix.toUpperCase()}_INTENTS_${id(tenant)}`;
  }
  get eventsStream(): string {
    return `${this.prefix.toUpperCase()}_EVENTS`;
  }
  /** One tenant's refusal and alias records (docs/tenancy.md). */
  decisionsStream(tenant: string): string {
    return `${this.prefix.toUpperCase()}_DECISIONS_${id(tenant)}`;
  }
  /** KV bucket of the deployment's tenants and their limits, written by the provisioner (docs/tenancy.md). */
  get tenantsBucket(): string {
    return `${this.prefix}_tenants`;
  }
  get resultsBucket(): string {
    return `${this.prefix}_results`;
  }
  /** KV bucket of the reconciler's projection. */
  get reconcileBucket(): string {
    return `${this.prefix}_reconcile`;
  }
  /** KV bucket of the audit-projector's projection. */
  get auditBucket(): string {
    return `${this.prefix}_audit`;
  }
  /** KV bucket of frozen tasks: `<tenant>.<taskToken>` → the operations under takeover. */
  get tasksBucket(): string {
    return `${this.prefix}_tasks`;
  }
  /** KV bucket of the contract registry (docs/contracts.md): file storage, written by the services and the contracts service. */
  get contractsBucket(): string {
    return `${this.prefix}_contracts`;
  }
  /**
   * An operator's contract registry commands and usage queries (`tooltx contracts`):
   * `<prefix>.ops.contracts.<operator>`, answered by the audit-projector. Only an operator granted
   * `contracts` may publish there.
   */
  opsContracts(operator: string): string {
    return `${this.prefix}.ops.contracts.${id(operator)}`;
  }
  get allOpsContracts(): string {
    return `${this.prefix}.ops.contracts.*`;
  }
  /** The operator of a contracts request subject, or null when it is not exactly one. */
  parseOpsContractsSubject(subject: string): string | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'ops' || t[2] !== 'contracts') return null;
    const operator = t[3]!;
    return ID_PATTERN.test(operator) && !operator.startsWith('_') ? operator : null;
  }
  /** Requests of operators to the takeover service: `<prefix>.takeover.<operator>`. */
  takeover(operator: string): string {
    return `${this.prefix}.takeover.${id(operator)}`;
  }
  get allTakeover(): string {
    return `${this.prefix}.takeover.*`;
  }
  /**
   * An operator's compensation requests (`tooltx compensate`): `<prefix>.ops.compensate.<operator>`,
   * answered by the authorizer. Only an operator granted `compensate` may publish there.
   */
  opsCompensate(operator: string): string {
    return `${this.prefix}.ops.compensate.${id(operator)}`;
  }
  get allOpsCompensate(): string {
    return `${this.prefix}.ops.compensate.*`;
  }
  /** The operator of a compensation request subject, or null when it is not exactly one. */
  parseOpsCompensateSubject(subject: string): string | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'ops' || t[2] !== 'compensate') return null;
    const operator = t[3]!;
    return ID_PATTERN.test(operator) && !operator.startsWith('_') ? operator : null;
  }
  /**
   * An operator's confirmations and discards of held-back operations (`tooltx confirm`, `tooltx
   * discard`): `<prefix>.ops.confirm.<operator>` and `<prefix>.ops.discard.<operator>`, answered by
   * the authorizer. The action is the subject's, as for a compensation, so the server's permission
   * is the whole check of who may ask; only an operator granted `confirm` may publish on either.
   */
  opsConfirm(operator: string): string {
    return `${this.prefix}.ops.confirm.${id(operator)}`;
  }
  opsDiscard(operator: string): string {
    return `${this.prefix}.ops.discard.${id(operator)}`;
  }
  get allOpsConfirm(): string {
    return `${this.prefix}.ops.confirm.*`;
  }
  get allOpsDiscard(): string {
    return `${this.prefix}.ops.discard.*`;
  }
  /** The action and operator of a confirmation or discard request subject, or null when it is not exactly one. */
  parseOpsConfirmSubject(subject: string): { action: 'confirm' | 'discard'; operator: string } | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'ops' || (t[2] !== 'confirm' && t[2] !== 'discard'))
      return null;
    const operator = t[3]!;
    return ID_PATTERN.test(operator) && !operator.startsWith('_') ? { action: t[2], operator } : null;
  }

  /**
   * An operator's queries of operations by state across tenants (`tooltx ops list`, the console):
   * `<prefix>.ops.query.<operator>`, answered by the audit-projector's operations query service.
   * Only an operator granted `query` may publish there.
   */
  opsQuery(operator: string): string {
    return `${this.prefix}.ops.query.${id(operator)}`;
  }
  get allOpsQuery(): string {
    return `${this.prefix}.ops.query.*`;
  }
  /** The operator of an operations query subject, or null when it is not exactly one. */
  parseOpsQuerySubject(subject: string): string | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'ops' || t[2] !== 'query') return null;
    const operator = t[3]!;
    return ID_PATTERN.test(operator) && !operator.startsWith('_') ? operator : null;
  }

  /**
   * An operator's debug-sampling requests (`tooltx debug`): `<prefix>.ops.debug.<operator>`,
   * answered by the executor's debug service. Only an operator granted `debug` may publish there.
   */
  opsDebug(operator: string): string {
    return `${this.prefix}.ops.debug.${id(operator)}`;
  }
  get allOpsDebug(): string {
    return `${this.prefix}.ops.debug.*`;
  }
  /** The operator of a debug request subject, or null when it is not exactly one. */
  parseOpsDebugSubject(subject: string): string | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'ops' || t[2] !== 'debug') return null;
    const operator = t[3]!;
    return ID_PATTERN.test(operator) && !operator.startsWith('_') ? operator : null;
  }
  /**
   * Where the debug service records a sampling switch or a read of samples by `operator`, in the
   * audit log stream: `_debug` is no tenant (ids starting with `_` are reserved).
   */
  debugAuditLog(operator: string): string {
    return `${this.prefix}.auditlog._debug.${id(operator)}`;
  }
  get allDebugAuditLog(): string {
    return `${this.prefix}.auditlog._debug.*`;
  }
  /** KV bucket of the debug-sampling switches, key: a contract's token (docs/debug-samples.md). */
  get samplingBucket(): string {
    return `${this.prefix}_sampling`;
  }
  /** KV bucket of the debug samples (docs/debug-samples.md). */
  get samplesBucket(): string {
    return `${this.prefix}_samples`;
  }
  /** A sample's key: `<contract token>.<tenant>.<opId>`. */
  sampleKey(contractToken: string, tenant: string, opId: string): string {
    if (!/^[a-z0-9_=-]{1,130}$/.test(contractToken))
      throw new TypeError(`invalid contract token ${JSON.stringify(contractToken)}`);
    return `${contractToken}.${id(tenant)}.${opid(opId)}`;
  }

  intent(tenant: string, actor: string): string {
    return `${this.prefix}.intent.${id(tenant)}.${id(actor)}`;
  }
  op(tenant: string, opId: string): string {
    return `${this.prefix}.op.${id(tenant)}.${opid(opId)}`;
  }
  /**
   * One actor's decision records about one operation key: each actor's refusals and aliases live on
   * their own subject, so another actor's request on the same key can never hide them (status
   * precedence; the last record of the caller's own subject is what status reads).
   */
  decision(tenant: string, opId: string, actor: string): string {
    return `${this.prefix}.decision.${id(tenant)}.${opid(opId)}.${id(actor)}`;
  }
  status(tenant: string, actor: string): string {
    return `${this.prefix}.status.${id(tenant)}.${id(actor)}`;
  }
  /**
   * Where the answer to one submission is pushed to its agent: the executor publishes the
   * committed receipt there, the authorizer and the executor a "poll now" for other outcomes. Null
   * when the submission id is not one subject token (`^[A-Za-z0-9_-]{1,128}$`): no push, the agent
   * polls. Best effort (core NATS): the status endpoint stays the truth.
   */
  push(tenant: string, actor: string, submissionId: string): string | null {
    return SUBMISSION_TOKEN.test(submissionId)
      ? `${this.prefix}.push.${id(tenant)}.${id(actor)}.${submissionId}`
      : null;
  }
  /** What one agent subscribes to for its pushed answers: `<p>.push.<tenant>.<actor>.*`. */
  pushesOf(tenant: string, actor: string): string {
    return `${this.prefix}.push.${id(tenant)}.${id(actor)}.*`;
  }
  /** Every pushed answer of one tenant (the tenant account's import). */
  pushesOfTenant(tenant: string): string {
    return `${this.prefix}.push.${id(tenant)}.>`;
  }
  get allPush(): string {
    return `${this.prefix}.push.>`;
  }
  resultKey(tenant: string, opId: string): string {
    return `${id(tenant)}.${opid(opId)}`;
  }
  /** Key of one operation in a projection bucket: `<tenant>.<opId>` (same form as {@link resultKey}). */
  projectionKey(tenant: string, opId: string): string {
    return `${id(tenant)}.${opid(opId)}`;
  }

  get allIntents(): string {
    return `${this.prefix}.intent.>`;
  }
  /** Every intent of one tenant: `<p>.intent.<tenant>.*` (its intake stream's subjects). */
  intentsOf(tenant: string): string {
    return `${this.prefix}.intent.${id(tenant)}.*`;
  }
  /** Every decision record of one tenant: `<p>.decision.<tenant>.*.*`. */
  decisionsOf(tenant: string): string {
    return `${this.prefix}.decision.${id(tenant)}.*.*`;
  }
  get allOps(): string {
    return `${this.prefix}.op.>`;
  }
  get allDecisions(): string {
    return `${this.prefix}.decision.>`;
  }
  get allStatus(): string {
    return `${this.prefix}.status.*.*`;
  }

  /** Stream of the audit service's record of every query and export, written before it answers. */
  get auditLogStream(): string {
    return `${this.prefix.toUpperCase()}_AUDITLOG`;
  }
  /** An auditor's requests to the audit service; only that auditor may publish here. */
  audit(tenant: string, auditor: string): string {
    return `${this.prefix}.audit.${id(tenant)}.${id(auditor)}`;
  }
  /** Where the audit service records a query of `auditor` before answering it. */
  auditLog(tenant: string, auditor: string): string {
    return `${this.prefix}.auditlog.${id(tenant)}.${id(auditor)}`;
  }
  get allAudit(): string {
    return `${this.prefix}.audit.*.*`;
  }
  get allAuditLog(): string {
    return `${this.prefix}.auditlog.*.*`;
  }

  /** `{ tenant, auditor }` of an audit request subject, or null when it is not exactly one. */
  parseAuditSubject(subject: string): { tenant: string; auditor: string } | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== 'audit') return null;
    const [, , tenant, auditor] = t as [string, string, string, string];
    return ID_PATTERN.test(tenant) && ID_PATTERN.test(auditor) ? { tenant, auditor } : null;
  }

  /** `{ tenant, actor }` of an intent or status subject, or null when it is not exactly one. */
  parseActorSubject(kind: 'intent' | 'status', subject: string): { tenant: string; actor: string } | null {
    const t = subject.split('.');
    if (t.length !== 4 || t[0] !== this.prefix || t[1] !== kind) return null;
    const [, , tenant, actor] = t as [string, string, string, string];
    return ID_PATTERN.test(tenant) && ID_PATTERN.test(actor) ? { tenant, actor } : null;
  }

  /**
   * `{ tenant, opId }` of an operation subject, or `{ tenant, opId, actor }` of a decision subject,
   * or null when it is not exactly one.
   */
  parseOpSubject(kind: 'op' | 'decision', subject: string): { tenant: string; opId: string; actor?: string } | null {
    const t = subject.split('.');
    if (t.length !== (kind === 'op' ? 4 : 5) || t[0] !== this.prefix || t[1] !== kind) return null;
    const [, , tenant, opId, actor] = t as [string, string, string, string, string | undefined];
    if (!ID_PATTERN.test(tenant) || !OPID.test(opId)) return null;
    if (actor === undefined) return { tenant, opId };
    return ID_PATTERN.test(actor) ? { tenant, opId, actor } : null;
  }
}

function id(v: string): string {
  if (!ID_PATTERN.test(v)) throw new TypeError(`invalid id token ${JSON.stringify(v)}`);
  return v;
}
function opid(v: string): string {
  if (!OPID.test(v)) throw new TypeError(`invalid operation id ${JSON.stringify(v)}`);
  return v;
}
