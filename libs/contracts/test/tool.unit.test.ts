import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { millis } from '@nats-io/transport-node';
import {
  defineContract,
  defineTool,
  EFFECT_DEFAULTS,
  effectClasses,
  ErrorClass,
  HttpStatusError,
  normalise,
  prepareCall,
  TooltxError,
  type ExecutionContext,
} from '@tooltx/contracts';
import { Subjects } from '@tooltx/nats';
import { tenantsOf } from '@tooltx/auth';
import { topology } from '@tooltx/streams';

const account = z.string().min(1).max(64);
const balance = defineTool({
  name: 'ledger.balance',
  description: 'Read a balance.',
  effect: 'read',
  input: z.strictObject({ account }),
  output: z.object({ balanceCents: z.number() }),
  normalise: { account: normalise.token },
});
const transferInput = z.strictObject({
  from: account,
  to: account,
  amountCents: z.number().int().positive(),
  memo: z.string().optional(),
});
const transfer = defineTool({
  name: 'ledger.transfer',
  description: 'Move an amount.',
  effect: 'charge',
  input: transferInput,
  normalise: { from: normalise.token, to: normalise.token },
  target: (i) => ({ from: i.from, to: i.to }),
});
const note = defineTool({
  name: 'kb.add',
  description: 'Add a note.',
  effect: 'create',
  input: z.strictObject({ kb: z.string(), title: z.string(), body: z.string() }),
  normalise: { kb: normalise.token, title: normalise.title },
});
const pay = { from: 'Ops', to: 'vendor', amountCents: 12_500 };
const ctx = {
  tenant: 'acme',
  actor: 'alice',
  operationKey: 'opk_x',
  downstreamKey: 'tx_x',
  attempt: 1,
  deadlineAt: 0,
  signal: new AbortController().signal,
} satisfies ExecutionContext;

/** The error `fn` rejects with. */
async function thrown(fn: () => Promise<unknown>): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

describe('defineTool: the effect class fills in what is omitted', () => {
  it('a read: version 1, the read timing, key and downstream defaults, and a key over the whole normalised input', () => {
    const c = balance.contract;
    expect(c.id).toBe('ledger.balance@1');
    expect({ timing: c.timing, key: c.key, downstream: c.downstream }).toEqual({
      timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 60_000 },
      key: { scope: 'tenant', retentionMs: 24 * 3600_000 },
      downstream: { honoursKey: true, enforcesDeadline: false },
    });
    expect(c.target({ account: 'ops' })).toEqual({ account: 'ops' });
    expect(c.intent({ account: 'ops' })).toEqual({});
    // FM-05: spellings the normaliser collapses are one read; another account is another.
    expect(prepareCall(c, 't', { account: ' OPS ' }).operationKey).toBe(
      prepareCall(c, 't', { account: 'ops' }).operationKey,
    );
    expect(prepareCall(c, 't', { account: 'vendor' }).operationKey).not.toBe(
      prepareCall(c, 't', { account: 'ops' }).operationKey,
    );
  });

  it('a create without target or intent: every field is in the key, and the result is the receipt only (FM-19)', () => {
    const c = note.contract;
    const n = { kb: 'research', title: 'Tides', body: 'High water at 06:12.' };
    const key = prepareCall(c, 't', n).operationKey;
    expect(prepareCall(c, 't', { ...n, kb: ' Research', title: ' Tides ' }).operationKey).toBe(key);
    expect(prepareCall(c, 't', { ...n, body: 'Low water.' }).operationKey).not.toBe(key);
    expect(prepareCall(c, 't', { ...n, kb: 'archive' }).operationKey).not.toBe(key);
    expect(c.output.parse({})).toEqual({});
    expect(c.key.retentionMs).toBe(7 * 24 * 3600_000);
    expect(c.downstream).toEqual({ honoursKey: false, enforcesDeadline: false });
  });

  it('a create with a target only: the intent is the rest of the input (a second note in one knowledge base is a second operation)', () => {
    const t = defineTool({ ...noteSpec(), target: (i) => ({ kb: i.kb }) });
    const n = { kb: 'research', title: 'Tides', body: 'High water.' };
    expect(t.contract.intent(n)).toEqual({ title: 'Tides', body: 'High water.' });
    expect(prepareCall(t.contract, 't', { ...n, title: 'Other' }).operationKey).not.toBe(
      prepareCall(t.contract, 't', n).operationKey,
    );
  });

  it('a charge: its key is the target within the task, so another amount is the same key with another input digest (idempotency_conflict, FM-03)', () => {
    const c = transfer.contract;
    const a = prepareCall(c, 'invoice-17', pay);
    const b = prepareCall(c, 'invoice-17', { ...pay, amountCents: 13_000 });
    expect(c.intent(a.input)).toEqual({});
    expect(b.operationKey).toBe(a.operationKey);
    expect(b.inputDigest).not.toBe(a.inputDigest);
    expect(prepareCall(c, 'invoice-18', pay).operationKey).not.toBe(a.operationKey);
    expect(prepareCall(c, 'invoice-17', { ...pay, to: 'other' }).operationKey).not.toBe(a.operationKey);
    expect(c.timing).toEqual({ timeoutMs: 15_000, runningBoundMs: 45_000, unknownDeadlineMs: 15 * 60_000 });
    expect(c.key.retentionMs).toBe(14 * 24 * 3600_000);
  });

  it('every default is overridden field by field; the rest stays the default', () => {
    const t = defineTool({
      ...noteSpec(),
      version: 3,
      target: (i) => ({ kb: i.kb }),
      intent: (i) => ({ title: i.title }),
      timing: { timeoutMs: 2_000 },
      key: { retentionMs: 3_600_000 },
      downstream: { honoursKey: true },
      output: z.object({ noteId: z.string() }),
    });
    const c = t.contract;
    expect(c.id).toBe('kb.add@3');
    expect(c.timing).toEqual({ ...EFFECT_DEFAULTS.create.timing, timeoutMs: 2_000 });
    expect(c.key).toEqual({ scope: 'tenant', retentionMs: 3_600_000 });
    expect(c.downstream).toEqual({ honoursKey: true, enforcesDeadline: false });
    expect(c.intent({ kb: 'a', title: 'T', body: 'B' })).toEqual({ title: 'T' });
    expect(() => c.output.parse({})).toThrow();
  });

  it('is the explicit form with the defaults written out: the same interface digest and the same keys', () => {
    const explicit = defineContract({
      name: 'ledger.transfer',
      version: 1,
      description: 'Move an amount.',
      effect: 'charge',
      input: transferInput,
      output: z.object({}),
      normalise: { from: normalise.token, to: normalise.token },
      target: (i) => ({ from: i.from, to: i.to }),
      intent: () => ({}),
      key: { scope: 'tenant', retentionMs: 14 * 24 * 3600_000 },
      timing: { timeoutMs: 15_000, runningBoundMs: 45_000, unknownDeadlineMs: 15 * 60_000 },
      downstream: { honoursKey: false, enforcesDeadline: false },
    });
    expect(transfer.contract.interfaceDigest).toBe(explicit.interfaceDigest);
    expect(prepareCall(transfer.contract, 't', pay)).toEqual(prepareCall(explicit, 't', pay));
  });

  it("every default is valid against the deployment's rules: key retention within the event log's default max age, an operation's lifetime within the intents' (FM-30)", () => {
    const topo = topology(new Subjects('tooltx'), {
      tenants: tenantsOf({ tenants: [{ id: 'acme', actors: ['alice'] }] }),
    });
    const eventsMaxAgeMs = millis(topo.streams.events.max_age!);
    const intentsMaxAgeMs = millis(topo.tenants![0]!.intents.max_age!);
    for (const effect of effectClasses) {
      const d = EFFECT_DEFAULTS[effect];
      expect(d.key.retentionMs, effect).toBeLessThanOrEqual(eventsMaxAgeMs);
      expect(d.timing.runningBoundMs + d.timing.unknownDeadlineMs, effect).toBeLessThanOrEqual(intentsMaxAgeMs);
      // `running` is looked at only once the executor has given up on its attempt.
      expect(d.timing.runningBoundMs, effect).toBeGreaterThanOrEqual(d.timing.timeoutMs);
    }
  });
});

describe('defineTool refuses a bad spec with a TypeError naming the field', () => {
  it.each([
    ['an unknown field', { timing: { timeout: 5_000 } }, /defineTool kb\.add: timing\.timeout: not a known field/],
    ['a duration that is not a positive integer', { timing: { timeoutMs: 0 } }, /timing\.timeoutMs/],
    ['a retention that is not a number', { key: { retentionMs: '7d' } }, /key\.retentionMs/],
    ['an input that would strip unknown fields', { input: z.object({ kb: z.string() }) }, /strictObject/],
    ['a name that is not dotted lower case', { name: 'KB Add' }, /name/],
  ])('%s', (_what, change, message) => {
    expect(() => defineTool({ ...noteSpec(), ...(change as object) } as never)).toThrow(TypeError);
    expect(() => defineTool({ ...noteSpec(), ...(change as object) } as never)).toThrow(message);
  });

  it('an intent without a target: the default target (the whole input) would keep in the key what the intent leaves out, so a changed incidental field would be a second effect', () => {
    expect(() =>
      defineTool({ ...noteSpec(), intent: (i: { title: string }) => ({ title: i.title }) } as never),
    ).toThrow(/target: required when intent is given/);
  });

  it('a read without an output, a charge or send without a target', () => {
    expect(() =>
      defineTool({ name: 'x.read', description: 'd', effect: 'read', input: z.strictObject({ a: z.string() }) }),
    ).toThrow(/x\.read: output: required for a read tool/);
    expect(() => defineTool({ name: 'x.pay', description: 'd', effect: 'charge', input: transferInput })).toThrow(
      /x\.pay: target: required for a charge tool/,
    );
    expect(() =>
      defineTool({ name: 'x.mail', description: 'd', effect: 'send', input: z.strictObject({ to: z.string() }) }),
    ).toThrow(/target: required for a send tool/);
  });
});

describe("implement: the trusted half, with the effect class's failure mapping", () => {
  const failing = (
    tool: typeof transfer | typeof note | typeof balance,
    err: unknown,
    failures?: Record<string, never>,
  ) =>
    thrown(() =>
      (tool.implement as (i: object) => { execute: (i: unknown, c: ExecutionContext) => Promise<unknown> })({
        execute: () => Promise.reject(err),
        ...(failures ? { failures } : {}),
      }).execute({}, ctx),
    );

  it('keeps the contract and every other field, and returns what execute returned', async () => {
    const probe = () => Promise.resolve({ found: false as const });
    const impl = transfer.implement({
      execute: () => Promise.resolve({ resourceId: 'tr_1', result: {} }),
      probe,
      policyVersion: 'p@1',
    });
    expect(impl.contract).toBe(transfer.contract);
    expect(impl.probe).toBe(probe);
    expect(impl.policyVersion).toBe('p@1');
    expect(await impl.execute(pay, ctx)).toEqual({ resourceId: 'tr_1', result: {} });
  });

  it.each([
    // [tool, status, what it becomes]
    ['charge', transfer, 404, ErrorClass.NotFound],
    ['charge', transfer, 402, ErrorClass.QuotaExceeded],
    ['charge', transfer, 412, ErrorClass.VersionConflict],
    ['charge', transfer, 409, 'unknown'],
    ['charge', transfer, 500, 'unknown'],
    ['create', note, 402, 'unknown'],
    ['create', note, 422, ErrorClass.InvalidInput],
    ['create', note, 401, ErrorClass.DependencyUnavailable],
    ['read', balance, 403, ErrorClass.Forbidden],
    ['read', balance, 409, ErrorClass.Internal],
    ['read', balance, 503, ErrorClass.DependencyUnavailable],
  ] as const)('%s: an answer %s becomes %s', async (_effect, tool, status, outcome) => {
    const err = await failing(tool, new HttpStatusError(status));
    if (outcome === 'unknown') {
      // Passed on as it is: the lifecycle makes the side effect `unknown`, for the probe.
      expect(err).toBeInstanceOf(HttpStatusError);
    } else {
      expect(err).toBeInstanceOf(TooltxError);
      expect((err as TooltxError).class).toBe(outcome);
    }
  });

  it('carries Retry-After as retryAfterMs, in seconds or as an HTTP date', async () => {
    const now = Date.parse('2026-12-01T10:00:00Z');
    const seconds = HttpStatusError.of({ status: 429, headers: new Headers({ 'retry-after': '3' }) }, now);
    const date = HttpStatusError.of(
      { status: 503, headers: new Headers({ 'retry-after': 'Tue, 01 Dec 2026 10:00:05 GMT' }) },
      now,
    );
    expect([seconds.retryAfterMs, date.retryAfterMs]).toEqual([3_000, 5_000]);
    expect(await failing(balance, seconds)).toMatchObject({
      class: ErrorClass.DependencyUnavailable,
      retryAfterMs: 3_000,
    });
    expect(seconds.message).toBe('downstream answered 429');
  });

  it('passes a TooltxError, a lost connection and an abort on as they are', async () => {
    const refused = new TooltxError(ErrorClass.Forbidden, 'no');
    const lost = new TypeError('fetch failed');
    const aborted = new DOMException('attempt timed out', 'TimeoutError');
    expect([await failing(transfer, refused), await failing(transfer, lost), await failing(balance, aborted)]).toEqual([
      refused,
      lost,
      aborted,
    ]);
  });

  it('takes overrides of the mapping by status or class', async () => {
    expect(await failing(transfer, new HttpStatusError(409), { '409': 'invalid_input' } as never)).toMatchObject({
      class: ErrorClass.InvalidInput,
    });
    expect(
      await failing(transfer, new HttpStatusError(404), { '4xx': 'unknown', '404': 'unknown' } as never),
    ).toBeInstanceOf(HttpStatusError);
    expect(
      await failing(transfer, new HttpStatusError(503), { '5xx': 'dependency_unavailable' } as never),
    ).toMatchObject({ class: ErrorClass.DependencyUnavailable });
  });

  it("a class the tool names takes the whole class over: { '4xx': 'unknown' } leaves no default 4xx rejection (404, 429) behind", async () => {
    for (const status of [404, 429, 400, 403])
      expect(await failing(note, new HttpStatusError(status), { '4xx': 'unknown' } as never)).toBeInstanceOf(
        HttpStatusError,
      );
    // An exact status the tool names as well still wins over its own class.
    expect(
      await failing(note, new HttpStatusError(403), { '4xx': 'unknown', '403': 'forbidden' } as never),
    ).toMatchObject({ class: ErrorClass.Forbidden });
  });

  it('the defaults are shared and frozen: no tool changes them for another', () => {
    expect(() => {
      (EFFECT_DEFAULTS.update.failures as Record<string, string>)['409'] = 'invalid_input';
    }).toThrow(TypeError);
    expect(() => {
      (note.failures as Record<string, string>)['409'] = 'invalid_input';
    }).toThrow(TypeError);
    expect(EFFECT_DEFAULTS.update.failures['409']).toBeUndefined();
  });

  it('refuses a malformed implementation with a TypeError naming the field', () => {
    const execute = () => Promise.resolve({ resourceId: 'r', result: {} });
    expect(() => transfer.implement({} as never)).toThrow(/implement ledger\.transfer@1: execute: must be a function/);
    expect(() => transfer.implement({ execute, prob: execute } as never)).toThrow(/prob: not a known field/);
    expect(() => transfer.implement({ execute, failures: { '40x': 'unknown' } })).toThrow(/failures\.40x/);
    expect(() => transfer.implement({ execute, failures: { '409': 'task_frozen' } as never })).toThrow(/failures\.409/);
  });

  it('a bad failure-mapping key is refused naming the key and what a key may be, not zod\'s "Invalid key in record"', () => {
    const execute = () => Promise.resolve({ resourceId: 'r', result: {} });
    for (const key of ['4x9', '600', '40', 'abc', '4XX'])
      expect(() => transfer.implement({ execute, failures: { [key]: 'unknown' } })).toThrow(
        `implement ledger.transfer@1: failures.${key}: not an HTTP status or class: expected a status such as 404 (100 to 599) or a class such as 4xx (1xx to 5xx)`,
      );
    // Statuses and classes 1xx to 5xx are keys.
    for (const key of ['100', '404', '599', '1xx', '5xx'])
      expect(() => transfer.implement({ execute, failures: { [key]: 'unknown' } })).not.toThrow();
  });
});

function noteSpec() {
  return {
    name: 'kb.add',
    description: 'Add a note.',
    effect: 'create' as const,
    input: z.strictObject({ kb: z.string(), title: z.string(), body: z.string() }),
    normalise: { kb: normalise.token, title: normalise.title },
  };
}
