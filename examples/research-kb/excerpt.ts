/**
 * Turns a Markdown page into what `web.fetch_page` may return: a title and a short excerpt of its
 * prose — never the whole page (tool output is filtered per field, FM-19).
 */

/** Longest excerpt, in characters. */
export const EXCERPT_CHARS = 400;

export function titleOf(markdown: string, fallback: string): string {
  for (const line of markdown.split('\n')) {
    const m = /^#{1,3}\s+(.+?)\s*#*\s*$/.exec(line);
    if (m) {
      const t = plain(m[1]!).trim();
      if (t) return t.slice(0, 200);
    }
  }
  return fallback.slice(0, 200);
}

export function excerptOf(markdown: string, maxChars = EXCERPT_CHARS): string {
  const text = markdown
    .replace(/```[\s\S]*?```/g, ' ')
    .replace(/~~~[\s\S]*?~~~/g, ' ')
    .replace(/<[^>]+>/g, ' ')
    .split('\n')
    .filter((l) => !/^\s*(#|\||!\[|\[!\[|---|===|\s*[-*]\s*\[)/.test(l))
    .join('\n');
  const paragraphs = text
    .split(/\n\s*\n/)
    .map((p) => plain(p).replace(/\s+/g, ' ').trim())
    .filter((p) => p.length >= 40);
  const joined = (paragraphs.length ? paragraphs : [plain(text).replace(/\s+/g, ' ').trim()]).join(' ');
  if (joined.length <= maxChars) return joined;
  const cut = joined.slice(0, maxChars);
  const space = cut.lastIndexOf(' ');
  return `${cut.slice(0, space > maxChars * 0.6 ? space : maxChars).trimEnd()}…`;
}

function plain(s: string): string {
  return s
    .replace(/!\[[^\]]*\]\([^)]*\)/g, '')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/[*_`]+/g, '');
}
