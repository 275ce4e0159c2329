import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  canonicalJson,
  defineContract,
  deriveOperationKey,
  normalise,
  prepareCall,
  TooltxError,
  operationIdOf,
  OPERATION_KEY_PATTERN,
} from '@tooltx/contracts';
import { sinkWrite } from '../../../test/fixtures/sink-tools.js';

const base = {
  bucket: 'kb-main',
  title: 'Tide tables',
  body: '# Notes\n\nHigh water at 06:12.',
  at: '2026-11-30T06:00:00.000Z',
};

describe('canonical JSON (RFC 8785)', () => {
  it('sorts keys by UTF-16 code units and serialises numbers the ECMAScript way', () => {
    expect(canonicalJson({ b: 1e21, a: '\u20ac', c: [1.0, -0, 0.000001] })).toBe(
      '{"a":"€","b":1e+21,"c":[1,0,0.000001]}',
    );
  });
});

describe('operation keys', () => {
  it('FM-05: field order, insignificant whitespace, line endings and equivalent time forms give the same key and input digest', () => {
    const variants = [
      base,
      {
        at: '2026-11-30T08:00:00+02:00',
        body: '# Notes  \r\n\r\nHigh water at 06:12.\r\n\r\n',
        title: '  Tide   tables ',
        bucket: 'KB-Main',
      },
      {
        title: 'Tide\ttables',
        bucket: ' kb-main',
        body: '# Notes\t\n\nHigh water at 06:12.',
        at: '2026-11-30T06:00:00Z',
      },
    ];
    const prepared = variants.map((v) => prepareCall(sinkWrite, 'task-1', v));
    expect(new Set(prepared.map((p) => p.operationKey)).size).toBe(1);
    expect(new Set(prepared.map((p) => p.inputDigest)).size).toBe(1);
    expect(prepared[0]!.operationKey).toMatch(OPERATION_KEY_PATTERN);
  });

  it('keeps fenced code blocks byte for byte: trailing spaces inside a fence are significant', () => {
    const a = prepareCall(sinkWrite, 't', { ...base, body: '```\nx = 1  \n```' });
    const b = prepareCall(sinkWrite, 't', { ...base, body: '```\nx = 1\n```' });
    expect(a.input.body).toBe('```\nx = 1  \n```');
    expect(a.operationKey).not.toBe(b.operationKey);
  });

  it('FM-04: the same body written to two knowledge bases is two operations', () => {
    const a = prepareCall(sinkWrite, 'task-1', base);
    const b = prepareCall(sinkWrite, 'task-1', { ...base, bucket: 'kb-other' });
    expect(a.operationKey).not.toBe(b.operationKey);
    expect(operationIdOf(a.operationKey)).not.toBe(operationIdOf(b.operationKey));
  });

  it('binds the task and the contract version: another task or version is another key', () => {
    const a = prepareCall(sinkWrite, 'task-1', base);
    expect(prepareCall(sinkWrite, 'task-2', base).operationKey).not.toBe(a.operationKey);
    const mat = { taskId: 'task-1', tool: 'sink.write', target: { bucket: 'kb-main' }, intent: {} };
    expect(deriveOperationKey({ ...mat, version: 1 })).not.toBe(deriveOperationKey({ ...mat, version: 2 }));
  });

  it('FM-03 groundwork: a field outside target and intent keeps the key but changes the input digest', () => {
    const a = prepareCall(sinkWrite, 'task-1', base);
    const b = prepareCall(sinkWrite, 'task-1', { ...base, priority: 'high' });
    expect(b.operationKey).toBe(a.operationKey);
    expect(b.inputDigest).not.toBe(a.inputDigest);
  });

  it('FM-06/FM-18: refuses an extra field such as a tenant id with its exact path, never stripping it', () => {
    const err = catchError(() => prepareCall(sinkWrite, 't', { ...base, tenantId: 'victim' }));
    expect(err.class).toBe('invalid_input');
    expect(err.issues).toEqual([
      { path: ['input', 'tenantId'], code: 'unrecognized_key', message: 'field not allowed' },
    ]);
  });

  it('FM-18: names every fixable field path and never echoes the received value', () => {
    const err = catchError(() => prepareCall(sinkWrite, 't', { ...base, title: '', at: 'yesterday-secret-value' }));
    expect(err.issues?.map((i) => i.path)).toEqual([
      ['input', 'title'],
      ['input', 'at'],
    ]);
    expect(JSON.stringify(err.issues)).not.toContain('yesterday-secret-value');
  });
});

describe('normalisers', () => {
  it('are idempotent', () => {
    const samples: [keyof typeof normalise.normalisers, string][] = [
      ['title', '  a \t b  '],
      ['markdown', 'a  \r\n~~~\n x  \n~~~\n\n\n'],
      ['instant', '2026-11-30T08:00:00.5+02:00'],
      ['url', 'HTTPS://Example.COM:443/a%7eb#frag'],
      ['token', ' KB-1 '],
    ];
    for (const [name, v] of samples) {
      const n = normalise.normalisers[name] as (x: string) => string;
      expect(n(n(v))).toBe(n(v));
    }
    expect(normalise.instant('2026-11-30T08:00:00.5+02:00')).toBe('2026-11-30T06:00:00.500Z');
  });
});

describe('defineContract', () => {
  it('refuses an input schema that would strip unknown fields instead of refusing them', () => {
    expect(() =>
      defineContract({
        name: 'x.y',
        version: 1,
        description: 'd',
        effect: 'read',
        input: z.object({ a: z.string() }) as never,
        output: z.object({}),
        target: () => ({}),
        intent: () => ({}),
        key: { scope: 'tenant', retentionMs: 1 },
        timing: { timeoutMs: 1, runningBoundMs: 1, unknownDeadlineMs: 1 },
        downstream: { honoursKey: false, enforcesDeadline: false },
      }),
    ).toThrow(/strictObject/);
  });

  it('gives a content digest that changes with the schema', () => {
    const spec = {
      name: 'x.y',
      version: 1,
      description: 'd',
      effect: 'read' as const,
      output: z.object({}),
      target: () => ({}),
      intent: () => ({}),
      key: { scope: 'tenant' as const, retentionMs: 1 },
      timing: { timeoutMs: 1, runningBoundMs: 1, unknownDeadlineMs: 1 },
      downstream: { honoursKey: false, enforcesDeadline: false },
    };
    const a = defineContract({ ...spec, input: z.strictObject({ a: z.string() }) });
    const b = defineContract({ ...spec, input: z.strictObject({ a: z.string().max(5) }) });
    expect(a.digest).not.toBe(b.digest);
    expect(defineContract({ ...spec, input: z.strictObject({ a: z.string() }) }).digest).toBe(a.digest);
  });
});

function catchError(fn: () => unknown): TooltxError {
  try {
    fn();
  } catch (err) {
    if (err instanceof TooltxError) return err;
    throw err;
  }
  throw new Error('expected a TooltxError');
}

describe("ill-formed Unicode is the caller's to fix", () => {
  it('a lone surrogate in the task id is invalid_input at taskId, like one in the input', () => {
    expect(() => prepareCall(sinkWrite, 'task-\uD800', base)).toThrow(
      expect.objectContaining({
        class: 'invalid_input',
        issues: [expect.objectContaining({ path: ['taskId'], code: 'invalid_unicode' })],
      }),
    );
    expect(() => prepareCall(sinkWrite, 'task-1', { ...base, title: 'x\uDC00' })).toThrow(
      expect.objectContaining({
        class: 'invalid_input',
        issues: [expect.objectContaining({ path: ['input', 'title'], code: 'invalid_unicode' })],
      }),
    );
  });
});
