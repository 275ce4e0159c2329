import { describe, expect, it } from 'vitest';
import { hasReplyWildcardCrash } from '../src/service.js';

describe('nats-server versions with the reply-wildcard crash (nats-io/nats-server#3862, fixed in 2.9.15)', () => {
  it('names 2.9.10 (Debian\'s) and every 2.x before 2.9.15, and nothing from 2.9.15 on', () => {
    for (const v of ['2.9.10', 'v2.9.10', '2.9.14', '2.8.4', '2.2.0']) expect([v, hasReplyWildcardCrash(v)]).toEqual([v, true]);
    for (const v of ['2.9.15', '2.9.21', '2.10.0', '2.11.4', '3.0.0', 'not-a-version']) expect([v, hasReplyWildcardCrash(v)]).toEqual([v, false]);
  });
});
