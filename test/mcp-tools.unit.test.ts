/**
 * MCP: what a host sees of the contracts (bin/mcp/tools.ts), without a stack: the tool list, the
 * annotations of each effect class, and the answers made from the SDK's outcomes.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineContract, effectClasses, type Contract } from '@tooltx/contracts';
import type { Receipt } from '@tooltx/lifecycle';
import { annotationsOf, callResult, catalogue, statusResult } from '../bin/mcp/tools.js';

const KEY = `opk_${'a'.repeat(43)}`;
const contract = (version: number, effect: Contract['effect'] = 'create') =>
  defineContract({
    name: 'demo.thing',
    version,
    description: 'A thing.',
    effect,
    input: z.strictObject({ name: z.string().min(1) }),
    output: z.object({ id: z.string() }),
    target: (i) => ({ name: i.name }),
    intent: () => ({}),
    key: { scope: 'tenant', retentionMs: 60_000 },
    timing: { timeoutMs: 1_000, runningBoundMs: 1_000, unknownDeadlineMs: 1_000 },
    downstream: { honoursKey: true, enforcesDeadline: false },
  });

describe('MCP tools of a contract list', () => {
  it('MCP annotations: reads and computations are read-only; create and update say destructiveHint false; delete, charge and send true; all idempotent', () => {
    const table = Object.fromEntries(effectClasses.map((e) => [e, annotationsOf(e)]));
    expect(table).toEqual({
      read: { readOnlyHint: true, idempotentHint: true },
      compute: { readOnlyHint: true, idempotentHint: true },
      create: { readOnlyHint: false, destructiveHint: false, idempotentHint: true },
      update: { readOnlyHint: false, destructiveHint: false, idempotentHint: true },
      delete: { readOnlyHint: false, destructiveHint: true, idempotentHint: true },
      send: { readOnlyHint: false, destructiveHint: true, idempotentHint: true },
      charge: { readOnlyHint: false, destructiveHint: true, idempotentHint: true },
    });
  });

  it('MCP the newest version of a name is served under the name, an older one as name.v<version>; schemas are JSON Schema without a dialect line', () => {
    const { tools, contractOf } = catalogue([contract(1), contract(2)]);
    expect(tools.map((t) => t.name)).toEqual(['demo.thing.v1', 'demo.thing', 'tooltx_status', 'tooltx_compensate']);
    expect(contractOf.get('demo.thing')?.version).toBe(2);
    expect(contractOf.get('demo.thing.v1')?.version).toBe(1);
    const t = tools[1]!;
    expect(t.inputSchema).toEqual({
      type: 'object',
      properties: { name: { type: 'string', minLength: 1 } },
      required: ['name'],
      additionalProperties: false,
    });
    expect((t.outputSchema.properties as Record<string, unknown>).result).toMatchObject({
      properties: { id: { type: 'string' } },
    });
    for (const x of tools) expect(x.inputSchema).not.toHaveProperty('$schema');
  });
});

describe('MCP answers', () => {
  it('MCP unknown is not an error: it names the key and tooltx_status', () => {
    const r = callResult('demo.thing', {
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'running',
      evidence: {
        operationKey: KEY,
        submissionIds: [],
        intentStored: true,
        statusAnswered: true,
        lastSeq: 2,
        elapsedMs: 900,
      },
      next: 'observe',
    });
    expect(r.isError).toBeUndefined();
    expect(r.structuredContent).toEqual({
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'running',
      next: 'observe',
    });
    expect(r.content[0]!.text).toContain(KEY);
    expect(r.content[0]!.text).toContain('tooltx_status');
  });

  it("MCP a refusal is an error, its field paths those of the call's params", () => {
    const r = callResult('demo.thing', {
      status: 'rejected',
      operationKey: null,
      error: { class: 'invalid_input', issues: [{ path: ['input', 'name'], code: 'too_small', message: 'empty' }] },
      next: 'replan',
    });
    expect(r.isError).toBe(true);
    expect(r.structuredContent.error).toEqual({
      class: 'invalid_input',
      issues: [{ path: ['arguments', 'name'], code: 'too_small', message: 'empty' }],
    });
    expect(r.content[0]!.text).toBe('rejected (invalid_input): arguments.name: empty; next: replan');
  });

  it('MCP a committed status answer whose receipt does not verify is reported unknown, without the receipt', () => {
    const answer = {
      operationKey: KEY,
      state: 'committed' as const,
      source: 'operation' as const,
      seq: 3,
      receipt: { operationKey: KEY } as unknown as Receipt,
      at: 0,
    };
    const forged = statusResult(answer, { valid: false, reason: 'untrusted_key' });
    expect(forged.structuredContent).toMatchObject({ status: 'unknown', next: 'observe' });
    expect(forged.structuredContent).not.toHaveProperty('receipt');
    const trusted = statusResult(answer, { valid: true });
    expect(trusted.structuredContent).toMatchObject({ status: 'committed', receipt: { operationKey: KEY } });
  });
});
