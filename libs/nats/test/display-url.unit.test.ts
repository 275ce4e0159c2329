import { describe, expect, it } from 'vitest';
import { connectProblemOf, displayUrl } from '../src/connect.js';

describe('displayUrl: a server list as it may be shown in errors and logs', () => {
  it('replaces every URL\'s user-info, even a password holding "," or "@", and keeps hosts and ports', () => {
    expect(displayUrl('nats://bob:s3cretPW@127.0.0.1:15222')).toBe('nats://[redacted]@127.0.0.1:15222');
    // Splitting on "," first would show `nats://bob:pa,[redacted]@…`.
    expect(displayUrl('nats://bob:pa,ss@h:1')).toBe('nats://[redacted]@h:1');
    expect(displayUrl('nats://u:p@ss@h:1')).toBe('nats://[redacted]@h:1');
    expect(displayUrl('nats://a:b@h1:1,tls://token@h2:2')).toBe('nats://[redacted]@h1:1,tls://[redacted]@h2:2');
    expect(displayUrl('bob:pw@h:4222')).toBe('[redacted]@h:4222');
    expect(displayUrl('nats://127.0.0.1:4222, nats://127.0.0.1:4223')).toBe(
      'nats://127.0.0.1:4222, nats://127.0.0.1:4223',
    );
  });
});

describe('connectProblemOf', () => {
  it('names a seed or creds file that is not one, and a list that is not a URL; nothing else', () => {
    expect(connectProblemOf(Object.assign(new Error('nkeys: invalid encoded key'), {}))).toMatchObject({
      about: 'identity',
    });
    expect(connectProblemOf(new Error('unable to parse credentials'))).toMatchObject({
      about: 'identity',
      problem: expect.stringContaining('.creds'),
    });
    expect(connectProblemOf(new Error('wrapped', { cause: new TypeError('Invalid URL') }))).toMatchObject({
      about: 'url',
    });
    expect(connectProblemOf(new Error('connection refused'))).toBeNull();
  });
});
