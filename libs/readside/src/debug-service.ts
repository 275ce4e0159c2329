import { randomUUID } from 'node:crypto';
import type { JetStreamClient } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { ErrorClass, operationIdOf, TooltxError, type ErrorInfo } from '@tooltx/contracts';
import {
  contractTokenOf,
  debugRequestSchema,
  decideSamplingStart,
  MAX_SAMPLES_PER_WINDOW,
  sampleReadable,
  sampleSchema,
  samplingOn,
  samplingSwitchSchema,
  type DebugRequest,
  type Sample,
  type SampleAccessRecord,
  type SamplingSwitch,
} from '@tooltx/lifecycle';
import { decode, encode, isTransient, type Subjects } from '@tooltx/nats';
import type { Logger } from '@tooltx/runtime';
import { operatorEndpoint, startResponder, type Responder } from './responder.js';

/** A sample as `list` names it: where and when, never its input or result. */
export type SampleSummary = Omit<Sample, 'input' | 'result' | 'schema'>;

/** The answers (JSON): `{ ok: true, … }` or `{ ok: false, error }` with a machine class and field issues. */
export type DebugAnswer =
  | {
      ok: true;
      started: SamplingSwitch;
      /** The window this start replaced, still open until then: its samples were purged with it. */
      replaced?: Pick<SamplingSwitch, 'windowId' | 'contract' | 'tenant' | 'until' | 'startedBy'>;
    }
  | { ok: true; stopped: boolean }
  | { ok: true; switches: SamplingSwitch[]; samples: SampleSummary[] }
  | { ok: true; sample: Sample | null }
  | { ok: false; error: ErrorInfo };

export interface DebugServiceDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  /** KV `<p>_sampling`. */
  switches: KV;
  /** KV `<p>_samples`. */
  samples: KV;
  subjects: Subjects;
  log: Logger;
  instance: string;
  /** Shortest window accepted, ms (`TOOLTX_DEBUG_MIN_WINDOW_MS`). */
  minWindowMs: number;
  /** Whether this deployment holds the contract `name@version`. */
  holds: (contract: string) => boolean;
  /** The contracts with a window open now (the sampler's copy of the switches). */
  open: () => readonly string[];
  /** Whether `tenant` is a tenant of the identity list (the tenants bucket the provisioner writes). */
  tenantListed: (tenant: string) => Promise<boolean>;
  /** Removes every sample of a contract token. */
  purge: (contractToken: string) => Promise<void>;
  now?: () => number;
}

type Recorded = Omit<SampleAccessRecord, 'schema' | 'queryId' | 'at' | 'operator' | 'instance'>;

/**
 * The debug service (docs/debug-samples.md): an operator granted `debug` starts and stops sampling
 * of one contract version and reads its samples. Request/reply on `<prefix>.ops.debug.<operator>`
 * (queue group `tooltx-debug`, JSON), served by the executor, which sees the content; the server
 * lets only a granted operator publish there, so the operator comes from the subject; answers go
 * only into that operator's inbox (FM-31, FM-32).
 *
 * Every request is recorded in the audit log (stream `<P>_AUDITLOG`, subject
 * `<prefix>.auditlog._debug.<operator>`) and answered only once the server confirmed storing it:
 * who, when, what, which contract and tenant, which samples (tenant and operation key) — never
 * their content. No record, no answer (`dependency_unavailable`), and a start or stop that could
 * not be recorded is not done. Refusals: `invalid_input` with field issues (a window beyond 4 h or
 * under the deployment's minimum at `forMs`), `dependency_unavailable`.
 */
export function startDebugService(d: DebugServiceDeps): Responder {
  const now = d.now ?? Date.now;

  const record = async (operator: string, r: Recorded): Promise<void> => {
    const rec: SampleAccessRecord = {
      schema: 1,
      queryId: randomUUID(),
      at: now(),
      operator,
      instance: d.instance,
      ...r,
    };
    let lastErr: unknown;
    for (let i = 0; i < 3; i++) {
      try {
        // The query id is the message id: a retried publish is stored once.
        await d.js.publish(d.subjects.debugAuditLog(operator), encode(rec), { msgID: rec.queryId, timeout: 5_000 });
        return;
      } catch (err) {
        if (!isTransient(err)) throw err;
        lastErr = err;
        await new Promise((r) => setTimeout(r, 100 * 2 ** i));
      }
    }
    throw lastErr;
  };
  const recorded = async (operator: string, r: Recorded): Promise<void> => {
    try {
      await record(operator, r);
    } catch (err) {
      d.log.error({ err, operator, kind: r.kind }, 'debug request not recorded: not answered');
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'debug request not recorded', { cause: err });
    }
  };

  /** The readable samples under `filter` (a key filter of the samples bucket), oldest first. */
  const samplesUnder = async (filter: string): Promise<Sample[]> => {
    const out: Sample[] = [];
    const t = now();
    for await (const e of await d.samples.history({ key: filter })) {
      if (e.operation !== 'PUT' || e.length === 0) continue;
      try {
        const s = decode(sampleSchema, e.value);
        if (sampleReadable(s, t)) out.push(s);
      } catch (err) {
        d.log.error({ err, key: e.key }, 'debug sample does not match its schema: skipped');
      }
    }
    return out.sort((a, b) => a.at - b.at).slice(0, MAX_SAMPLES_PER_WINDOW);
  };

  const handle = async (req: DebugRequest, operator: string): Promise<DebugAnswer> => {
    const l = d.log.child({ operator, action: req.action });
    switch (req.action) {
      case 'start': {
        const decided = decideSamplingStart(req, {
          now: now(),
          operator,
          windowId: randomUUID(),
          minWindowMs: d.minWindowMs,
          holds: d.holds,
          open: d.open(),
          tenantListed: req.tenant === undefined ? true : await d.tenantListed(req.tenant),
        });
        if (decided.kind === 'refuse') {
          await recorded(operator, { kind: 'invalid', contract: req.contract, samples: [], count: 0 });
          throw new TooltxError(ErrorClass.InvalidInput, 'sampling window refused', { issues: decided.issues });
        }
        const sw = decided.sw;
        await recorded(operator, {
          kind: 'sampling_start',
          contract: sw.contract,
          ...(sw.tenant ? { tenant: sw.tenant } : {}),
          windowId: sw.windowId,
          until: sw.until,
          samples: [],
          count: 0,
        });
        const token = contractTokenOf(sw.contract);
        // A window replacing an open one: the earlier window's samples go with it, and the answer says so.
        const prior = await d.switches.get(token);
        const was =
          prior?.operation === 'PUT' && prior.length > 0 ? decode(samplingSwitchSchema, prior.value) : undefined;
        const replaced =
          was && samplingOn(was, now())
            ? {
                windowId: was.windowId,
                contract: was.contract,
                ...(was.tenant ? { tenant: was.tenant } : {}),
                until: was.until,
                startedBy: was.startedBy,
              }
            : undefined;
        await d.purge(token);
        await d.switches.put(token, encode(sw));
        l.info(
          {
            contract: sw.contract,
            tenant: sw.tenant,
            until: sw.until,
            windowId: sw.windowId,
            ...(replaced ? { replacedWindowId: replaced.windowId } : {}),
          },
          replaced ? 'sampling on; the open window it replaces and its samples purged' : 'sampling on',
        );
        return { ok: true, started: sw, ...(replaced ? { replaced } : {}) };
      }
      case 'stop': {
        await recorded(operator, { kind: 'sampling_stop', contract: req.contract, samples: [], count: 0 });
        const token = contractTokenOf(req.contract);
        const e = await d.switches.get(token);
        const was = !!e && e.operation === 'PUT' && e.length > 0;
        if (was) await d.switches.purge(token);
        await d.purge(token);
        l.info({ contract: req.contract, wasOn: was }, 'sampling off; samples purged');
        return { ok: true, stopped: was };
      }
      case 'list': {
        const token = req.contract ? contractTokenOf(req.contract) : '*';
        const samples = await samplesUnder(req.tenant ? `${token}.${req.tenant}.*` : `${token}.>`);
        const t = now();
        const switches: SamplingSwitch[] = [];
        for await (const k of await d.switches.keys()) {
          const e = await d.switches.get(k);
          if (e?.operation !== 'PUT' || e.length === 0) continue;
          const sw = decode(samplingSwitchSchema, e.value);
          if (samplingOn(sw, t) && (!req.contract || sw.contract === req.contract)) switches.push(sw);
        }
        await recorded(operator, {
          kind: 'samples_list',
          ...(req.contract ? { contract: req.contract } : {}),
          ...(req.tenant ? { tenant: req.tenant } : {}),
          samples: samples.map((s) => ({ tenant: s.tenant, operationKey: s.operationKey })),
          count: samples.length,
        });
        l.info({ count: samples.length }, 'debug samples listed');
        return {
          ok: true,
          switches,
          samples: samples.map(({ schema: _s, input: _i, result: _r, ...summary }) => summary),
        };
      }
      case 'show': {
        const key = d.subjects.sampleKey(contractTokenOf(req.contract), req.tenant, operationIdOf(req.operationKey));
        const e = await d.samples.get(key);
        let sample: Sample | null = null;
        if (e && e.operation === 'PUT' && e.length > 0) {
          const s = decode(sampleSchema, e.value);
          if (sampleReadable(s, now()) && s.operationKey === req.operationKey) sample = s;
        }
        await recorded(operator, {
          kind: 'samples_show',
          contract: req.contract,
          tenant: req.tenant,
          samples: sample ? [{ tenant: sample.tenant, operationKey: sample.operationKey }] : [],
          count: sample ? 1 : 0,
        });
        l.info({ count: sample ? 1 : 0 }, 'debug sample shown');
        return { ok: true, sample };
      }
    }
  };

  return startResponder(
    d.nc,
    d.log,
    operatorEndpoint({
      name: 'debug',
      subject: d.subjects.allOpsDebug,
      queue: 'tooltx-debug',
      parse: (subject) => d.subjects.parseOpsDebugSubject(subject),
      what: 'a debug request',
      schema: debugRequestSchema,
      handle,
      beforeInvalidAnswer: (operator) => recorded(operator, { kind: 'invalid', samples: [], count: 0 }),
    }),
  );
}
