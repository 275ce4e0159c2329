/**
 * The contract half of compensation and held-back commits (docs/compensation.md): the key a
 * compensation runs under, the declarations a contract may make (refused when malformed, part of
 * both digests), and the strict request a caller sends.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  compensatingInput,
  compensationOf,
  ContractSpecError,
  defineContract,
  defineTool,
  deriveCompensationKey,
  deriveOperationKey,
  ErrorClass,
  MAX_REASON_CHARS,
  parseCompensationRequest,
  parseConfirmationRequest,
  reasonDigestOf,
  TooltxError,
  type ContractSpec,
} from '@tooltx/contracts';

const KEY = `opk_${'A'.repeat(43)}`;
const OTHER_KEY = `opk_${'B'.repeat(43)}`;

const noteInput = z.strictObject({ kb: z.string(), title: z.string(), body: z.string() });
const base = {
  name: 'kb.write_note',
  version: 1,
  description: 'Write a note.',
  effect: 'create' as const,
  input: noteInput,
  output: z.object({}),
  target: (i: z.infer<typeof noteInput>) => ({ kb: i.kb }),
  intent: (i: z.infer<typeof noteInput>) => ({ title: i.title, body: i.body }),
  key: { scope: 'tenant' as const, retentionMs: 86_400_000 },
  timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 60_000 },
  downstream: { honoursKey: true, enforcesDeadline: true },
} satisfies ContractSpec<typeof noteInput>;
const compensation = {
  tool: 'kb.delete_note@1',
  deadlineMs: 86_400_000,
  permission: 'kb.delete',
  input: (o: { input: { kb: string }; receipt: { resourceId: string } }) => ({
    kb: o.input.kb,
    noteId: o.receipt.resourceId,
  }),
};

function specError(fn: () => unknown): ContractSpecError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ContractSpecError) return err;
    throw err;
  }
  throw new Error('expected a ContractSpecError');
}
function tooltxError(fn: () => unknown): TooltxError {
  try {
    fn();
  } catch (err) {
    if (err instanceof TooltxError) return err;
    throw err;
  }
  throw new Error('expected a TooltxError');
}

describe("a compensation's operation key", () => {
  const del1 = { tool: 'kb.delete_note', version: 1 };

  it('FM-21: the same original and compensating contract give the same key, every time', () => {
    expect(deriveCompensationKey(KEY, del1)).toBe(deriveCompensationKey(KEY, { ...del1 }));
    expect(deriveCompensationKey(KEY, del1)).toMatch(/^opk_[A-Za-z0-9_-]{43}$/);
  });

  it('another compensating contract, another version or another original is another key', () => {
    const k = deriveCompensationKey(KEY, del1);
    expect(deriveCompensationKey(KEY, { tool: 'kb.archive_note', version: 1 })).not.toBe(k);
    expect(deriveCompensationKey(KEY, { tool: 'kb.delete_note', version: 2 })).not.toBe(k);
    expect(deriveCompensationKey(OTHER_KEY, del1)).not.toBe(k);
    // Never the original's own key, nor a key the ordinary derivation could make from the same names.
    expect(k).not.toBe(KEY);
    expect(k).not.toBe(deriveOperationKey({ taskId: KEY, tool: 'kb.delete_note', version: 1, target: {}, intent: {} }));
  });

  it('FM-21: who asks and why are not inputs: two requests with different reasons name one compensation', () => {
    const contract = defineContract({ ...base, compensation });
    const a = parseCompensationRequest({ operationKey: KEY, reason: 'wrong knowledge base' });
    const b = parseCompensationRequest({ operationKey: KEY, reason: 'asked by the owner, twice' });
    expect(compensationOf(contract, a.operationKey)).toEqual(compensationOf(contract, b.operationKey));
    expect(compensationOf(contract, KEY)).toEqual({ ...del1, operationKey: deriveCompensationKey(KEY, del1) });
    // The function takes no requester or reason at all.
    expect(deriveCompensationKey.length).toBe(2);
  });

  it('refuses something that is not an operation key', () => {
    expect(() => deriveCompensationKey('opk_short', del1)).toThrow(TypeError);
  });

  it('a contract without a declaration has no compensation', () => {
    expect(compensationOf(defineContract(base), KEY)).toBeNull();
  });
});

describe('contract declarations', () => {
  it('an unknown field (a `compensate` that means nothing) is refused with its path, never ignored', () => {
    const e = specError(() => defineContract({ ...base, compensate: compensation } as never));
    expect(e).toBeInstanceOf(TypeError);
    expect(e.issues).toEqual([{ path: ['compensate'], code: 'unrecognized_key', message: 'not a known field' }]);
    expect(e.message).toMatch(/compensate: not a known field/);
    const nested = specError(() => defineContract({ ...base, compensation: { ...compensation, undo: true } } as never));
    expect(nested.issues[0]?.path).toEqual(['compensation', 'undo']);
    const tool = specError(() =>
      defineTool({
        name: 'kb.add',
        description: 'Add.',
        effect: 'create',
        input: noteInput,
        compensate: compensation,
      } as never),
    );
    expect(tool.issues[0]?.path).toEqual(['compensate']);
  });

  it('a malformed declaration is refused at its field', () => {
    const at = (over: Record<string, unknown>) =>
      specError(() => defineContract({ ...base, compensation: { ...compensation, ...over } } as never)).issues[0]?.path;
    expect(at({ tool: 'kb.delete_note' })).toEqual(['compensation', 'tool']);
    expect(at({ deadlineMs: 0 })).toEqual(['compensation', 'deadlineMs']);
    expect(at({ permission: '' })).toEqual(['compensation', 'permission']);
    expect(at({ allowedFrom: ['rejected'] })).toEqual(['compensation', 'allowedFrom', 0]);
    expect(at({ allowedFrom: [] })).toEqual(['compensation', 'allowedFrom']);
    expect(at({ input: { noteId: 'x' } })).toEqual(['compensation', 'input']);
    expect(
      specError(() => defineContract({ ...base, confirm: { permission: 'mail.confirm' } } as never)).issues[0]?.path,
    ).toEqual(['confirm', 'deadlineMs']);
  });

  it('a read or computation has nothing to compensate or hold back; no contract compensates itself', () => {
    const read = { ...base, effect: 'read' as const };
    expect(specError(() => defineContract({ ...read, compensation })).issues[0]).toMatchObject({
      path: ['compensation'],
      code: 'no_side_effect',
    });
    expect(
      specError(() => defineContract({ ...read, confirm: { permission: 'x.confirm', deadlineMs: 1 } })).issues[0],
    ).toMatchObject({ path: ['confirm'], code: 'no_side_effect' });
    expect(
      specError(() => defineContract({ ...base, compensation: { ...compensation, tool: 'kb.write_note@1' } }))
        .issues[0],
    ).toMatchObject({ path: ['compensation', 'tool'], code: 'compensates_itself' });
  });

  it('allowedFrom defaults to committed only', () => {
    expect(defineContract({ ...base, compensation }).compensation?.allowedFrom).toEqual(['committed']);
  });

  it('the declarations are part of the digest and of the interface digest; the input builder only of the digest', () => {
    const plain = defineContract(base);
    const withComp = defineContract({ ...base, compensation });
    expect(withComp.digest).not.toBe(plain.digest);
    expect(withComp.interfaceDigest).not.toBe(plain.interfaceDigest);
    // An absent declaration leaves the digests as they were.
    expect(defineContract({ ...base, compensation: undefined }).digest).toBe(plain.digest);
    // A promise to the caller (deadline, permission, compensating contract) changes both.
    for (const over of [{ deadlineMs: 3_600_000 }, { permission: 'kb.admin' }, { tool: 'kb.archive_note@1' }]) {
      const c = defineContract({ ...base, compensation: { ...compensation, ...over } });
      expect(c.digest).not.toBe(withComp.digest);
      expect(c.interfaceDigest).not.toBe(withComp.interfaceDigest);
    }
    // Another builder changes what the server runs, not what a host must agree on (function text differs per build).
    const rebuilt = defineContract({
      ...base,
      compensation: { ...compensation, input: (o) => ({ noteId: o.receipt.resourceId, kb: o.input.kb }) },
    });
    expect(rebuilt.digest).not.toBe(withComp.digest);
    expect(rebuilt.interfaceDigest).toBe(withComp.interfaceDigest);
    // The default written out is the same declaration.
    expect(defineContract({ ...base, compensation: { ...compensation, allowedFrom: ['committed'] } }).digest).toBe(
      withComp.digest,
    );
    const confirm = defineContract({ ...base, confirm: { permission: 'kb.confirm', deadlineMs: 60_000 } });
    expect(confirm.digest).not.toBe(plain.digest);
    expect(confirm.interfaceDigest).not.toBe(plain.interfaceDigest);
    const preview = defineContract({
      ...base,
      confirm: { permission: 'kb.confirm', deadlineMs: 60_000, preview: z.object({ words: z.number() }) },
    });
    expect(preview.interfaceDigest).not.toBe(confirm.interfaceDigest);
  });

  it('defineTool passes the declarations on to the contract, and a prepare or discard step needs confirm (and a preview needs prepare)', () => {
    const execute = async () => ({ resourceId: 'n1', result: {} });
    const plain = defineTool({ name: 'kb.add', description: 'Add.', effect: 'create', input: noteInput });
    expect(() => plain.implement({ execute, prepare: async () => ({ preview: {} }) })).toThrow(ContractSpecError);
    expect(specError(() => plain.implement({ execute, discard: async () => {} })).issues[0]).toMatchObject({
      path: ['discard'],
      code: 'no_confirm',
    });
    const held = defineTool({
      name: 'mail.send_draft',
      description: 'Send a drafted mail.',
      effect: 'send',
      input: noteInput,
      target: (i) => ({ kb: i.kb }),
      confirm: { permission: 'mail.confirm', deadlineMs: 60_000, preview: z.object({ subject: z.string() }) },
      compensation,
    });
    expect(held.contract.confirm?.permission).toBe('mail.confirm');
    expect(held.contract.compensation?.tool).toBe('kb.delete_note@1');
    expect(specError(() => held.implement({ execute })).issues[0]).toMatchObject({
      path: ['prepare'],
      code: 'required',
    });
    const both = held.implement({
      execute,
      prepare: async () => ({ preview: { subject: 's' } }),
      discard: async () => {},
    });
    expect(both.prepare).toBeTypeOf('function');
    expect(both.discard).toBeTypeOf('function');
  });

  it("the compensating input is built from the original's input and receipt, and the reason", () => {
    const c = defineContract({
      ...base,
      compensation: { ...compensation, input: (o, reason) => ({ noteId: o.receipt.resourceId, why: reason }) },
    });
    const receipt = {
      tenant: 'acme',
      operationKey: KEY,
      tool: 'kb.write_note',
      version: 1,
      resourceId: 'note-7',
      resultDigest: `sha256:${'1'.repeat(64)}`,
      committedAt: 1,
    };
    expect(compensatingInput(c, { input: { kb: 'r', title: 't', body: 'b' }, receipt }, 'dup')).toEqual({
      noteId: 'note-7',
      why: 'dup',
    });
    const e = tooltxError(() => compensatingInput(defineContract(base), { input: {}, receipt }, 'dup'));
    expect(e.class).toBe(ErrorClass.CompensationNotAllowed);
  });
});

describe('the compensation request', () => {
  it(`bounds the reason (1 to ${MAX_REASON_CHARS} characters) and names every bad field`, () => {
    expect(parseCompensationRequest({ operationKey: KEY, reason: 'r'.repeat(MAX_REASON_CHARS) }).reason).toHaveLength(
      MAX_REASON_CHARS,
    );
    const paths = (v: unknown) => tooltxError(() => parseCompensationRequest(v)).issues?.map((i) => i.path);
    expect(tooltxError(() => parseCompensationRequest({ operationKey: KEY, reason: '' })).class).toBe('invalid_input');
    expect(paths({ operationKey: KEY, reason: 'r'.repeat(MAX_REASON_CHARS + 1) })).toEqual([['reason']]);
    expect(paths({ operationKey: KEY, reason: '   ' })).toEqual([['reason']]);
    expect(paths({ operationKey: 'opk_x', reason: 'why' })).toEqual([['operationKey']]);
    expect(paths({ operationKey: KEY, reason: 'why', tool: 'kb.other@1' })).toEqual([['tool']]);
    expect(paths({ operationKey: KEY })).toEqual([['reason']]);
  });

  it('never echoes the reason in its error, and keeps only its digest', () => {
    const secret = 'x'.repeat(MAX_REASON_CHARS + 1);
    const e = tooltxError(() => parseCompensationRequest({ operationKey: KEY, reason: secret }));
    expect(JSON.stringify(e.toInfo())).not.toContain('xxxxxxxx');
    expect(reasonDigestOf('dup')).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(reasonDigestOf('dup')).toBe(reasonDigestOf('dup'));
    expect(reasonDigestOf('dup')).not.toBe(reasonDigestOf('dup2'));
  });

  it('a confirm or discard names the operation key only', () => {
    expect(parseConfirmationRequest({ operationKey: KEY })).toEqual({ operationKey: KEY });
    expect(tooltxError(() => parseConfirmationRequest({ operationKey: KEY, force: true })).issues?.[0]?.path).toEqual([
      'force',
    ]);
  });
});
