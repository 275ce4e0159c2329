/**
 * The rules of debug samples (docs/debug-samples.md), given/when/then: which sampling windows may
 * be opened, which ended attempt is sampled, which stored sample may still be read.
 */
import { describe, expect, it } from 'vitest';
import {
  contractTokenOf,
  debugRequestSchema,
  decideSample,
  decideSamplingStart,
  MAX_OPEN_WINDOWS,
  MAX_SAMPLING_WINDOW_MS,
  sampleReadable,
  type SamplingSwitch,
} from '../src/sampling.js';

const windowId = '0b7e3b43-6f1e-4a39-9a57-2f9cd5f5f0a1';
const ctx = {
  now: 1_000_000,
  operator: 'oscar',
  windowId,
  minWindowMs: 60_000,
  holds: (c: string) => c === 'kb.write_note@1' || c === 'web.fetch_page@1',
  open: [] as string[],
  tenantListed: true,
};
const start = (over: Record<string, unknown> = {}) =>
  debugRequestSchema.parse({ action: 'start', contract: 'kb.write_note@1', forMs: 30 * 60_000, ...over }) as Extract<
    ReturnType<typeof debugRequestSchema.parse>,
    { action: 'start' }
  >;
const on = (over: Partial<SamplingSwitch> = {}): SamplingSwitch => {
  const d = decideSamplingStart(start(), ctx);
  if (d.kind !== 'start') throw new Error('expected a window');
  return { ...d.sw, ...over };
};

describe('opening a sampling window', () => {
  it('given 30 minutes, then sampling is on from now for 30 minutes, every call, at most 100 samples, nothing taken', () => {
    expect(decideSamplingStart(start(), ctx)).toEqual({
      kind: 'start',
      sw: {
        schema: 1,
        windowId,
        contract: 'kb.write_note@1',
        rate: 1,
        max: 100,
        taken: 0,
        startedAt: ctx.now,
        until: ctx.now + 30 * 60_000,
        startedBy: 'oscar',
      },
    });
  });

  it('given a tenant, a rate and a max, then the switch carries them', () => {
    const d = decideSamplingStart(start({ tenant: 'acme', rate: 0.1, max: 5 }), ctx);
    expect(d).toMatchObject({ kind: 'start', sw: { tenant: 'acme', rate: 0.1, max: 5 } });
  });

  it('given a tenant the identity list does not hold, then it is refused at tenant (unknown_tenant)', () => {
    expect(decideSamplingStart(start({ tenant: 'acmee' }), { ...ctx, tenantListed: false })).toEqual({
      kind: 'refuse',
      issues: [expect.objectContaining({ path: ['tenant'], code: 'unknown_tenant' })],
    });
  });

  it('given a contract the deployment does not hold, then it is refused at contract (not_found), and no open window is replaced', () => {
    expect(decideSamplingStart(start({ contract: 'kb.write_notee@1' }), ctx)).toEqual({
      kind: 'refuse',
      issues: [expect.objectContaining({ path: ['contract'], code: 'not_found' })],
    });
  });

  it('given as many windows open as allowed, then a new contract is refused (too_many_windows) and one already open may be replaced', () => {
    const open = Array.from({ length: MAX_OPEN_WINDOWS - 1 }, (_, i) => `other.tool_${i}@1`);
    const full = { ...ctx, open: [...open, 'kb.write_note@1'] };
    expect(decideSamplingStart(start({ contract: 'web.fetch_page@1' }), full)).toEqual({
      kind: 'refuse',
      issues: [expect.objectContaining({ path: ['contract'], code: 'too_many_windows' })],
    });
    expect(decideSamplingStart(start(), full).kind).toBe('start');
    expect(decideSamplingStart(start({ contract: 'web.fetch_page@1' }), { ...ctx, open }).kind).toBe('start');
  });

  it('given a window beyond 4 hours, then it is refused at forMs (too_big); exactly 4 hours opens', () => {
    expect(decideSamplingStart(start({ forMs: MAX_SAMPLING_WINDOW_MS + 1 }), ctx)).toEqual({
      kind: 'refuse',
      issues: [expect.objectContaining({ path: ['forMs'], code: 'too_big' })],
    });
    expect(decideSamplingStart(start({ forMs: MAX_SAMPLING_WINDOW_MS }), ctx).kind).toBe('start');
  });

  it("given a window under the deployment's minimum, then it is refused at forMs (too_small); a lower minimum admits it", () => {
    expect(decideSamplingStart(start({ forMs: 2_000 }), ctx)).toEqual({
      kind: 'refuse',
      issues: [expect.objectContaining({ path: ['forMs'], code: 'too_small' })],
    });
    expect(decideSamplingStart(start({ forMs: 2_000 }), { ...ctx, minWindowMs: 1_000 }).kind).toBe('start');
  });

  it('given a rate outside (0, 1], a max over 1000 or a bad contract, then the request is refused at that field', () => {
    const paths = (over: Record<string, unknown>) => {
      const r = debugRequestSchema.safeParse({ action: 'start', contract: 'kb.write_note@1', forMs: 60_000, ...over });
      return r.success ? [] : r.error.issues.map((i) => i.path.join('.'));
    };
    expect(paths({ rate: 0 })).toEqual(['rate']);
    expect(paths({ rate: 1.5 })).toEqual(['rate']);
    expect(paths({ max: 1_001 })).toEqual(['max']);
    expect(paths({ contract: 'kb.write_note' })).toEqual(['contract']);
    expect(paths({ tenant: 'Acme!' })).toEqual(['tenant']);
  });
});

describe('whether an ended attempt is sampled', () => {
  it('given no switch for its contract, then it is not', () => {
    expect(decideSample(undefined, { tenant: 'acme' }, ctx.now, 0)).toBe('skip');
  });

  it('given a switch on and a draw under the rate, then it is; over the rate, it is not', () => {
    const sw = on({ rate: 0.5 });
    expect(decideSample(sw, { tenant: 'acme' }, ctx.now + 1, 0.49)).toBe('sample');
    expect(decideSample(sw, { tenant: 'acme' }, ctx.now + 1, 0.5)).toBe('skip');
  });

  it("given a switch for one tenant, then another tenant's operation is never sampled", () => {
    const sw = on({ tenant: 'acme' });
    expect(decideSample(sw, { tenant: 'acme' }, ctx.now, 0)).toBe('sample');
    expect(decideSample(sw, { tenant: 'globex' }, ctx.now, 0)).toBe('skip');
  });

  it("given a switch naming no tenant, then every tenant's operation is sampled (docs/debug-samples.md)", () => {
    const sw = on();
    expect(sw.tenant).toBeUndefined();
    expect(decideSample(sw, { tenant: 'acme' }, ctx.now, 0)).toBe('sample');
    expect(decideSample(sw, { tenant: 'globex' }, ctx.now, 0)).toBe('sample');
  });

  it('given the window ended (or not begun), then nothing is sampled', () => {
    const sw = on();
    expect(decideSample(sw, { tenant: 'acme' }, sw.until, 0)).toBe('skip');
    expect(decideSample(sw, { tenant: 'acme' }, sw.startedAt - 1, 0)).toBe('skip');
  });

  it('given max samples taken, then no more', () => {
    expect(decideSample(on({ max: 3, taken: 2 }), { tenant: 'acme' }, ctx.now, 0)).toBe('sample');
    expect(decideSample(on({ max: 3, taken: 3 }), { tenant: 'acme' }, ctx.now, 0)).toBe('skip');
  });
});

describe('reading a stored sample', () => {
  it('given a sample before its expiry, then it is readable; at or after it, never', () => {
    expect(sampleReadable({ expiresAt: 10 }, 9)).toBe(true);
    expect(sampleReadable({ expiresAt: 10 }, 10)).toBe(false);
    expect(sampleReadable({ expiresAt: 10 }, 11)).toBe(false);
  });
});

describe("a contract's token in keys", () => {
  it('given two contracts whose names differ only around dots and versions, then their tokens differ and are one subject token', () => {
    const a = contractTokenOf('kb.v1@2');
    const b = contractTokenOf('kb@12');
    expect(a).toBe('kb-v1=2');
    expect(b).toBe('kb=12');
    expect(a).not.toContain('.');
  });
});
