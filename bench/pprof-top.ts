/**
 * `npx tsx bench/pprof-top.ts FILE.pprof [--n 30] [--focus REGEX]` — the top functions of a Go CPU
 * profile (nats-server's `/debug/pprof/profile`), flat and cumulative, without the Go toolchain.
 * The file is gzipped protobuf in pprof's `profile.proto` layout (github.com/google/pprof,
 * proto/profile.proto): samples (location ids, values), locations (lines → function ids),
 * functions (name index into the string table). With `--focus`, only samples whose stack contains
 * a function matching REGEX are counted.
 */
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';

type Field = { no: number; wt: number; v: bigint | Uint8Array };

function* fields(b: Uint8Array): Generator<Field> {
  let i = 0;
  const varint = (): bigint => {
    let r = 0n;
    let s = 0n;
    for (;;) {
      const x = b[i++]!;
      r |= BigInt(x & 0x7f) << s;
      if (!(x & 0x80)) return r;
      s += 7n;
    }
  };
  while (i < b.length) {
    const key = Number(varint());
    const no = key >> 3;
    const wt = key & 7;
    if (wt === 0) yield { no, wt, v: varint() };
    else if (wt === 2) {
      const len = Number(varint());
      yield { no, wt, v: b.subarray(i, i + len) };
      i += len;
    } else if (wt === 1) {
      i += 8;
    } else if (wt === 5) {
      i += 4;
    } else throw new Error(`wire type ${wt}`);
  }
}
function packed(f: Field): bigint[] {
  if (f.wt === 0) return [f.v as bigint];
  const out: bigint[] = [];
  const b = f.v as Uint8Array;
  let i = 0;
  while (i < b.length) {
    let r = 0n;
    let s = 0n;
    for (;;) {
      const x = b[i++]!;
      r |= BigInt(x & 0x7f) << s;
      if (!(x & 0x80)) break;
      s += 7n;
    }
    out.push(r);
  }
  return out;
}

const args = process.argv.slice(2);
const file = args.find((a) => !a.startsWith('--'))!;
const n = Number(args[args.indexOf('--n') + 1] ?? 30) || 30;
const focus = args.includes('--focus') ? new RegExp(args[args.indexOf('--focus') + 1]!) : null;
const raw = readFileSync(file);
const buf = raw[0] === 0x1f ? gunzipSync(raw) : raw;

const strings: string[] = [];
const samples: { locs: number[]; value: number }[] = [];
const locs = new Map<number, number[]>(); // location id → function ids (innermost first)
const funcs = new Map<number, number>(); // function id → name string index
for (const f of fields(buf)) {
  if (f.no === 2) {
    let ls: number[] = [];
    let vals: number[] = [];
    for (const g of fields(f.v as Uint8Array)) {
      if (g.no === 1) ls = ls.concat(packed(g).map(Number));
      if (g.no === 2) vals = vals.concat(packed(g).map(Number));
    }
    samples.push({ locs: ls, value: vals[1] ?? vals[0] ?? 0 });
  } else if (f.no === 4) {
    let id = 0;
    const fn: number[] = [];
    for (const g of fields(f.v as Uint8Array)) {
      if (g.no === 1) id = Number(g.v);
      if (g.no === 4) for (const h of fields(g.v as Uint8Array)) if (h.no === 1) fn.push(Number(h.v));
    }
    locs.set(id, fn);
  } else if (f.no === 5) {
    let id = 0;
    let name = 0;
    for (const g of fields(f.v as Uint8Array)) {
      if (g.no === 1) id = Number(g.v);
      if (g.no === 2) name = Number(g.v);
    }
    funcs.set(id, name);
  } else if (f.no === 6) strings.push(Buffer.from(f.v as Uint8Array).toString('utf8'));
}
const nameOf = (fid: number) => strings[funcs.get(fid) ?? 0] ?? '?';
const flat = new Map<string, number>();
const cum = new Map<string, number>();
let total = 0;
for (const s of samples) {
  const stack = s.locs.flatMap((l) => locs.get(l) ?? []).map(nameOf);
  if (focus && !stack.some((x) => focus.test(x))) continue;
  total += s.value;
  if (stack[0]) flat.set(stack[0], (flat.get(stack[0]) ?? 0) + s.value);
  for (const x of new Set(stack)) cum.set(x, (cum.get(x) ?? 0) + s.value);
}
const ms = (v: number) => (v / 1e6).toFixed(0);
const pct = (v: number) => ((100 * v) / total).toFixed(1);
process.stdout.write(
  `${file}: ${ms(total)} ms of CPU in ${samples.length} samples${focus ? ` (focus ${focus})` : ''}\n\nflat:\n`,
);
for (const [k, v] of [...flat].sort((a, b) => b[1] - a[1]).slice(0, n))
  process.stdout.write(`${ms(v).padStart(8)} ms ${pct(v).padStart(5)} %  ${k}\n`);
process.stdout.write('\ncumulative:\n');
for (const [k, v] of [...cum].sort((a, b) => b[1] - a[1]).slice(0, n))
  process.stdout.write(`${ms(v).padStart(8)} ms ${pct(v).padStart(5)} %  ${k}\n`);
