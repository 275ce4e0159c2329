import { describe, expect, it } from 'vitest';
import {
  assertSupportedServer,
  MIN_SERVER_VERSION,
  parseServerVersion,
  serverVersionAtLeast,
  UnsupportedServerError,
} from '@tooltx/nats';

describe('supported nats-server versions (docs/nats-server.md)', () => {
  it('2.10.0 is the oldest supported: every 2.9.x and earlier is refused, 2.10 and later pass', () => {
    expect(MIN_SERVER_VERSION).toBe('2.10.0');
    for (const v of ['2.9.10', 'v2.9.21', '2.9.99', '2.2.0', '1.4.1', 'not-a-version', ''])
      expect([v, serverVersionAtLeast(v, MIN_SERVER_VERSION)]).toEqual([v, false]);
    for (const v of ['2.10.0', '2.10.27', 'nats-server: v2.10.27', '2.11.4', '2.15.1', '3.0.0'])
      expect([v, serverVersionAtLeast(v, MIN_SERVER_VERSION)]).toEqual([v, true]);
  });

  it('compares each part as a number (2.10 is after 2.9; 2.10.9 before 2.10.27)', () => {
    expect(serverVersionAtLeast('2.10.9', '2.10.27')).toBe(false);
    expect(serverVersionAtLeast('2.10.27', '2.10.27')).toBe(true);
    expect(serverVersionAtLeast('2.11.0', '2.10.27')).toBe(true);
    expect(parseServerVersion('nats-server: v2.15.1')).toEqual([2, 15, 1]);
    expect(parseServerVersion('nope')).toBeNull();
  });

  it('assertSupportedServer names the version it refuses and how to get a newer one', () => {
    expect(() => assertSupportedServer('2.9.10', 'the server at nats://127.0.0.1:4222')).toThrow(
      UnsupportedServerError,
    );
    expect(() => assertSupportedServer('2.9.10')).toThrow(
      /^the server is nats-server 2\.9\.10; tooltx needs 2\.10\.0 or later.*scripts\/ensure-nats-server/,
    );
    expect(() => assertSupportedServer(undefined)).toThrow(/unknown version/);
    expect(() => assertSupportedServer('2.10.27')).not.toThrow();
  });
});
