/**
 * FM-16 at the source: the one logger of every process never writes a credential, cookie, body,
 * page text or an error's message. Lines are captured from a real pino destination.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger, ensureKeyFile, keyedDigest, readKeyFile, safeError, SecretFileError } from '../src/index.js';

const dir = mkdtempSync(join(tmpdir(), 'tooltx-logger-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CANARY = 'CANARY-logger-5e1f0c';

function capture(keyFile?: string) {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      cb();
    },
  });
  const log = createLogger({ service: 'test', instance: 'i-1', level: 'trace', hmacKeyFile: keyFile, destination });
  return { log, lines, parsed: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

class DownstreamError extends Error {
  readonly code = 'http_503';
  readonly status = 503;
  constructor(message: string, opts?: ErrorOptions) {
    super(message, opts);
    this.name = 'DownstreamError';
  }
}

describe('FM-16: the logger of every process', () => {
  it('censors credentials, cookies, authorisation headers, bodies and page text at any depth and in child bindings', () => {
    const { log, lines } = capture();
    const child = log.child({ token: CANARY, req: { headers: { cookie: CANARY } } });
    child.info(
      {
        authorization: `Bearer ${CANARY}`,
        request: { headers: { authorization: CANARY, 'set-cookie': CANARY }, body: CANARY },
        deep: {
          a: {
            b: {
              c: { note: CANARY, page: CANARY, text: CANARY, excerpt: CANARY, input: { body: CANARY }, result: CANARY },
            },
          },
        },
        list: [{ password: CANARY }, { seed: CANARY }],
        loose: `the header was Bearer ${CANARY}`,
        nkey: 'SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4',
        seedInText: 'seed SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4 here',
        tenant: 'acme',
      },
      'request done',
    );
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toContain(CANARY);
    expect(lines[0]).not.toContain('SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4');
    expect(JSON.parse(lines[0]!)).toMatchObject({
      tenant: 'acme',
      msg: 'request done',
      service: 'test',
      instance: 'i-1',
    });
  });

  it('censors credentials under key names of any spelling, and credentials run into free text, in any case', () => {
    const { log, lines } = capture();
    const seed = 'SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4';
    const keys = [
      'api-key',
      'authToken',
      'sessionToken',
      'X-Auth-Token',
      'aws_secret_access_key',
      'secretKey',
      'private-key',
      'passwd_hash',
      'bearerToken',
      'cardNumber',
      'cvv',
      'ssn',
      'otp',
      'pin',
      'Set-Cookie ',
      'token\u200b',
    ];
    const texts = [
      `bearer ${CANARY}x1`,
      `Authorization: Token ${CANARY}x2`,
      `x${seed}y`,
      `${seed}0`,
      `password=${CANARY}x3`,
      `https://example.org/p?access_token=${CANARY}x4&api_key=${CANARY}x5`,
      `eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.${CANARY}x6`,
      `key AKIAIOSFODNN7EXAMPLE and sk-${CANARY}x7abcdefgh`,
    ];
    log.info({ nested: [{ deep: Object.fromEntries(keys.map((k) => [k, `${CANARY}-${k}`])) }], texts, tenant: 'acme' });
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toContain(CANARY);
    expect(lines[0]).not.toContain(seed);
    expect(lines[0]).not.toContain('AKIAIOSFODNN7EXAMPLE');
    // What is not a credential stays readable: the tenant, the URL's host and path, prose.
    log.warn('no service token: any caller is trusted');
    expect(lines[1]).toContain('no service token: any caller is trusted');
    expect(lines[0]).toContain('"tenant":"acme"');
    expect(lines[0]).toContain('https://example.org/p?');
  });

  it('keeps the fields the services log under ordinary names', () => {
    const { log, lines } = capture();
    const fields = {
      operationKey: 'opk_x',
      taskId: 't-1',
      keyId: 'k1',
      author: 'ann',
      resourceId: 'r1',
      tokensUsed: 3,
    };
    log.info(fields);
    const line = JSON.parse(lines[0]!) as Record<string, unknown>;
    expect(line).toMatchObject({ operationKey: 'opk_x', taskId: 't-1', keyId: 'k1', author: 'ann', resourceId: 'r1' });
    // A count named after tokens is censored too: the rule errs on the side of the secret.
    expect(line.tokensUsed).toBe('[redacted]');
  });

  it('logs a downstream error as its class, code, status and an HMAC of its message — never the message, at any depth', () => {
    const keyFile = ensureKeyFile(join(dir, 'log.key'));
    const { log, parsed, lines } = capture(keyFile);
    const cause = new Error(`connect refused: ${CANARY}`);
    const err = new DownstreamError(`page answered 503 ${CANARY}`, { cause });
    log.warn({ err, nested: { error: err } }, 'attempt failed');
    log.error(err); // pino would make the message the line's msg
    log.error({ err }); // … and here too
    log.info('value %s', CANARY); // printf arguments are dropped
    expect(lines.join('\n')).not.toContain(CANARY);
    const [first, second, third, fourth] = parsed();
    const hmac = keyedDigest(readKeyFile(keyFile), 'log-error-message', `page answered 503 ${CANARY}`);
    expect(first!.err).toEqual({
      type: 'DownstreamError',
      code: 'http_503',
      status: 503,
      messageHmac: hmac,
      cause: {
        type: 'Error',
        messageHmac: keyedDigest(readKeyFile(keyFile), 'log-error-message', `connect refused: ${CANARY}`),
      },
    });
    expect((first!.nested as { error: unknown }).error).toEqual(first!.err);
    expect(second).toMatchObject({ msg: 'error', err: { messageHmac: hmac } });
    expect(third).toMatchObject({ msg: 'error', err: { messageHmac: hmac } });
    expect(fourth!.msg).toBe('value %s');
  });

  it('keeps the messages of its own infrastructure errors, and only issue paths and codes of a TooltxError', () => {
    const e = Object.assign(new Error(`kb refused: ${CANARY}`), {
      name: 'TooltxError',
      class: 'not_found',
      issues: [{ path: ['input', 'kb'], code: 'not_found', message: CANARY }],
    });
    const out = safeError(e);
    expect(JSON.stringify(out)).not.toContain(CANARY);
    expect(out).toMatchObject({
      type: 'TooltxError',
      class: 'not_found',
      issues: [{ path: ['input', 'kb'], code: 'not_found' }],
    });
    expect(safeError(Object.assign(new Error('invalid configuration: X'), { name: 'ConfigError' }))).toMatchObject({
      message: 'invalid configuration: X',
    });
  });

  it('refuses a key file others can read, or a short one; never quotes the key', () => {
    const open = join(dir, 'open.key');
    writeFileSync(open, 'k'.repeat(64));
    chmodSync(open, 0o644);
    expect(() => readKeyFile(open)).toThrow(SecretFileError);
    expect(() => readKeyFile(open)).toThrow(/chmod 600/);
    const short = join(dir, 'short.key');
    writeFileSync(short, 'short', { mode: 0o600 });
    expect(() => readKeyFile(short)).toThrow(/at least 32/);
    expect(() => readKeyFile(join(dir, 'missing.key'))).toThrow(/ENOENT/);
    try {
      readKeyFile(short);
    } catch (err) {
      expect((err as Error).message).not.toContain('short\n');
    }
    // The key file survives: a second ensure keeps the first key.
    const k = ensureKeyFile(join(dir, 'keep.key'));
    const before = readKeyFile(k).toString();
    ensureKeyFile(k);
    expect(readKeyFile(k).toString()).toBe(before);
  });
});
