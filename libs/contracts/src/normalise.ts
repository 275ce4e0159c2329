/**
 * Per-field normalisers: each turns equivalent spellings of one value into one form, so that
 * insignificant differences never produce a new operation key (FM-05). They are deliberately per
 * field — a title and a Markdown body have different notions of "insignificant whitespace".
 *
 * Each normaliser is total over the values its field's schema accepts and idempotent
 * (`n(n(x)) === n(x)`).
 */
export type Normaliser<T = unknown> = ((value: T) => T) & { readonly normaliserName: string };

function named<T>(name: string, fn: (value: T) => T): Normaliser<T> {
  return Object.assign(fn, { normaliserName: name });
}

/** A one-line title: Unicode NFC, trimmed, every run of whitespace collapsed to one space. */
export const title = named<string>('title@1', (s) => s.normalize('NFC').trim().replace(/\s+/gu, ' '));

/** An identifier-like token compared case-insensitively: NFC, trimmed, lower case. */
export const token = named<string>('token@1', (s) => s.normalize('NFC').trim().toLowerCase());

/**
 * A Markdown body: only Unicode NFC, line endings (CRLF / CR → LF), trailing spaces and tabs at
 * the end of lines outside fenced code blocks, and trailing blank lines at the end. Everything else,
 * including the inside of fenced code blocks (``` or ~~~), is kept byte for byte.
 */
export const markdown = named<string>('markdown@1', (s) => {
  const lines = s.normalize('NFC').replace(/\r\n?/g, '\n').split('\n');
  let fence: string | null = null;
  const out = lines.map((line) => {
    const m = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (fence === null) {
      if (m) fence = m[1]!;
      return line.replace(/[ \t]+$/, '');
    }
    if (m && m[1]![0] === fence[0] && m[1]!.length >= fence.length && line.trim() === m[1]) fence = null;
    return line;
  });
  while (out.length > 1 && out[out.length - 1] === '') out.pop();
  return out.join('\n');
});

/**
 * An instant given as ISO-8601 / RFC 3339 with an offset or `Z`: rewritten to UTC with
 * milliseconds (`2026-11-30T06:00:00.000Z`). Equivalent forms (`+02:00` offsets, missing or extra
 * fractional digits) collapse to one. Throws `RangeError` for text that is not a valid instant;
 * contracts validate the format first (`z.iso.datetime({ offset: true })`).
 */
export const instant = named<string>('instant@1', (s) => {
  const ms = Date.parse(s.trim());
  if (Number.isNaN(ms)) throw new RangeError('not an ISO-8601 instant');
  return new Date(ms).toISOString();
});

/**
 * An absolute http(s) URL in WHATWG serialisation: scheme and host lower-cased, default port
 * dropped, percent-encoding normalised by the URL parser, fragment removed.
 */
export const url = named<string>('url@1', (s) => {
  const u = new URL(s.trim());
  u.hash = '';
  return u.toString();
});

/** An object's fields normalised by their own normalisers; other fields kept as they are. */
export function fields<T extends Record<string, unknown>>(
  per: { [K in keyof T]?: Normaliser<NonNullable<T[K]>> },
): Normaliser<T> {
  const name = `fields{${Object.entries(per)
    .map(([k, n]) => `${k}:${(n as Normaliser).normaliserName}`)
    .join(',')}}`;
  return named<T>(name, (v) => {
    const out: Record<string, unknown> = { ...v };
    for (const [k, n] of Object.entries(per))
      if (out[k] !== undefined && n) out[k] = (n as (x: unknown) => unknown)(out[k]);
    return out as T;
  });
}

/** Every element of a list normalised by `n` (order kept: order is meaningful in a list). */
export function each<T>(n: Normaliser<T>): Normaliser<T[]> {
  return named<T[]>(`each(${n.normaliserName})`, (v) => v.map((x) => n(x)));
}

export const normalisers = { title, token, markdown, instant, url } as const;
