/**
 * `scripts/ensure-nats-server` finds the machine's Debian mirror in either apt sources format — the
 * one-line `sources.list` and deb822 `*.sources` — before it fetches nats-server through a temporary
 * apt configuration (docs/nats-server.md). The apt directory is a fixture here (TOOLTX_APT_ETC);
 * the fetch itself runs in CI, which checks that /etc/apt is unchanged afterwards.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..');
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** An apt directory holding `files` (path → text), and what `--print-mirror` says of it. */
function mirrorOf(files: Record<string, string>) {
  const etc = mkdtempSync(join(tmpdir(), 'tooltx-apt-etc-'));
  dirs.push(etc);
  mkdirSync(join(etc, 'sources.list.d'));
  for (const [path, text] of Object.entries(files)) writeFileSync(join(etc, path), text);
  const r = spawnSync(join(ROOT, 'scripts', 'ensure-nats-server'), ['--print-mirror'], {
    env: { ...process.env, TOOLTX_APT_ETC: etc },
    encoding: 'utf8',
    timeout: 10_000,
  });
  const lines = r.stdout
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split('\t'));
  return {
    status: r.status,
    out: lines[0] ?? [],
    mirrors: lines.map((l) => l[0]),
    keyrings: [...new Set(lines.map((l) => l[1]))],
    stderr: r.stderr,
  };
}

describe("scripts/ensure-nats-server: the machine's Debian mirror", () => {
  it("every candidate in order (sources.list, *.sources, *.list), each checked with Debian's archive keyring only — a third party naming a Debian suite cannot bring its own key; odd lines neither hang nor count", () => {
    const r = mirrorOf({
      'sources.list': [
        'deb cdrom:[Debian GNU/Linux 12]/ bookworm main',
        'deb [arch=amd64 http://unterminated.example/debian bookworm main',
        'deb http://one.example/debian bookworm main',
        '',
      ].join('\n'),
      'sources.list.d/grafana.list':
        'deb [signed-by=/usr/share/keyrings/grafana.key] https://apt.grafana.com stable main\n',
      'sources.list.d/debian.sources':
        'types: deb\nuris: http://two.example/debian http://three.example/debian\nsuites: trixie\ncomponents: main\n\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: No\n',
    });
    expect(r.status).toBe(0);
    expect(r.mirrors).toEqual([
      'http://one.example/debian',
      'http://two.example/debian',
      'http://three.example/debian',
      'https://apt.grafana.com',
    ]);
    expect(r.keyrings).toEqual(['/usr/share/keyrings/debian-archive-keyring.gpg']);
  });

  it('deb822 (*.sources): the first enabled stanza of a Debian release suite, with its Signed-By keyring', () => {
    const r = mirrorOf({
      'sources.list.d/debian.sources': [
        'Types: deb',
        'URIs: http://disabled.example/debian',
        'Suites: bookworm',
        'Components: main',
        'Enabled: no',
        '',
        'Types: deb',
        'URIs: http://security.example/debian-security',
        'Suites: bookworm-security',
        'Components: main',
        '',
        '# the mirror',
        'Types: deb deb-src',
        'URIs: http://mirror.example/debian',
        'Suites: bookworm bookworm-updates',
        'Components: main',
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg',
        '',
      ].join('\n'),
      'sources.list.d/nodesource.sources':
        'Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n',
    });
    expect(r).toMatchObject({
      status: 0,
      out: ['http://mirror.example/debian', '/usr/share/keyrings/debian-archive-keyring.gpg'],
    });
  });

  it('one-line sources.list: the first `deb` line of a release suite, skipping comments, deb-src, security and third parties', () => {
    const r = mirrorOf({
      'sources.list': [
        '# deb http://commented.example/debian bookworm main',
        'deb-src http://src.example/debian bookworm main',
        'deb http://security.example/debian-security bookworm-security main',
        'deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main',
        'deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://ftp.example/debian/ bookworm main contrib',
        '',
      ].join('\n'),
    });
    expect(r).toMatchObject({
      status: 0,
      out: ['http://ftp.example/debian/', '/usr/share/keyrings/debian-archive-keyring.gpg'],
    });
  });

  it('no Debian mirror at all: exit 1, saying where it looked', () => {
    const r = mirrorOf({ 'sources.list.d/other.list': 'deb https://deb.nodesource.com/node_20.x nodistro main\n' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('no Debian mirror in');
  });
});
