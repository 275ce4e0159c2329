/**
 * The console's pages: eta templates with every interpolation escaped (`<%= %>`; nothing here uses
 * the raw form but for a template included in another). What a template is given went through the
 * logs' scrubber first ({@link ConsoleViews.render}): a value under a key named like a credential,
 * a body or an input is censored, and so is a string that looks like a bearer token or an nkey
 * seed — the same redaction as the logs (docs/security.md "Secrets and redaction").
 */
import { randomBytes } from 'node:crypto';
import { Eta } from 'eta/core';
import { scrubber } from '@tooltx/runtime';

/** Labels of the statuses (an audit record's `refused` too): the compensation outcomes are told apart. */
export const STATUS_LABELS: Readonly<Record<string, string>> = {
  accepted: 'accepted',
  running: 'running',
  committed: 'committed',
  rejected: 'rejected',
  unknown: 'unknown',
  awaiting_confirmation: 'held back',
  rolled_back: 'rolled back',
  compensation_requested: 'compensation requested',
  compensated: 'compensated',
  compensation_failed: 'compensation failed',
  refused: 'refused at intake',
};

const LAYOUT = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title><%= it.title %> · tooltx console</title>
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script>
</head>
<body>
<header>
  <strong>tooltx console</strong>
  <% if (it.who) { %>
  <nav>
    <a href="/operations">Operations</a>
    <% if (it.who.kind === 'operator') { %><a href="/takeovers">Takeovers</a><a href="/contracts">Contracts</a><% } %>
  </nav>
  <span class="who" data-who="<%= it.who.login %>"><%= it.who.kind %> <%= it.who.login %></span>
  <% if (it.csrf) { %><form method="post" action="/logout" class="inline">
    <input type="hidden" name="_csrf" value="<%= it.csrf %>">
    <button type="submit">Log out</button>
  </form><% } %>
  <% } %>
</header>
<main>
<h1><%= it.title %></h1>
<%~ it.body %>
</main>
</body>
</html>`;

const LABEL = `<span class="label st-<%= it.status %>" data-status="<%= it.status %>"><%= it.labels[it.status] ?? it.status %></span>`;

const LOGIN = `<% layout('@layout') %>
<% if (it.failed) { %><p class="error" id="login-error">Wrong login or password.</p><% } %>
<form method="post" action="/login" class="login">
  <input type="hidden" name="_csrf" value="<%= it.csrf %>">
  <label>Login <input name="login" autocomplete="username" required maxlength="130" placeholder="oscar or acme/audrey"></label>
  <label>Password <input name="password" type="password" autocomplete="current-password" required maxlength="200"></label>
  <button type="submit">Log in</button>
</form>`;

const OPS_LIVE = `<p class="meta">Updated <time><%= it.now %></time> · <%= it.rows.length %> operation(s)<% if (it.rows.length >= it.maxRows) { %> (the first <%= it.maxRows %>)<% } %></p>
<table id="operations">
<thead><tr><th>first seen</th><th>tenant</th><th>operation</th><th>contract</th><th>state</th><th>actor</th><th>side effect</th><th>handed over</th></tr></thead>
<tbody>
<% for (const r of it.rows) { %>
<tr data-key="<%= r.operationKey %>" data-tenant="<%= r.tenant %>">
<td><%= r.firstAt %></td><td><%= r.tenant %></td>
<td><a href="/operations/<%= r.tenant %>/<%= r.operationKey %>"><code><%= r.operationKey %></code></a></td>
<td><%= r.contract ?? '—' %></td>
<td><%~ include('@label', { status: r.status, labels: it.labels }) %><% if (r.compensationOf) { %> <small>of <code><%= r.compensationOf %></code></small><% } %></td>
<td><%= r.actor %></td><td><%= r.sideEffect %></td><td><%= r.takeover ?? '' %></td>
</tr>
<% } %>
</tbody>
</table>`;

const OPS = `<% layout('@layout') %>
<form method="get" action="/operations" class="filters">
  <label>Tenant <% if (it.who.kind === 'auditor') { %><input name="tenant" value="<%= it.who.tenant %>" readonly><% } else { %><input name="tenant" value="<%= it.filter.tenant ?? '' %>" placeholder="all"><% } %></label>
  <label>Contract <input name="contract" value="<%= it.filter.contract ?? '' %>" placeholder="kb.write_note@1"></label>
  <label>State <select name="state"><option value="">all</option><% for (const s of it.states) { %><option value="<%= s %>"<% if (it.filter.state === s) { %> selected<% } %>><%= it.labels[s] ?? s %></option><% } %></select></label>
  <label>Since <input name="since" value="<%= it.filter.since ?? '' %>" placeholder="24h or 2026-12-01T00:00:00Z"></label>
  <label>Until <input name="until" value="<%= it.filter.until ?? '' %>" placeholder="now"></label>
  <button type="submit">Filter</button>
</form>
<section id="live" data-refresh-ms="<%= it.refreshMs %>"><%~ include('@ops-live', it) %></section>`;

const OP_LIVE = `<% const r = it.record; %>
<p class="meta">Updated <time><%= it.now %></time></p>
<dl class="summary">
<dt>State</dt><dd id="state"><% if (r) { %><%~ include('@label', { status: r.status, labels: it.labels }) %><% } else { %>no audit record yet<% } %></dd>
<dt>Tenant</dt><dd><%= it.tenant %></dd>
<% if (r) { %>
<dt>Contract</dt><dd><%= r.contract ?? '—' %></dd>
<dt>Side effect</dt><dd><%= r.sideEffect %></dd>
<% if (r.errorClass) { %><dt>Error class</dt><dd><%= r.errorClass %></dd><% } %>
<% if (r.compensates) { %><dt>Compensates</dt><dd><a href="/operations/<%= it.tenant %>/<%= r.compensates %>"><code><%= r.compensates %></code></a></dd><% } %>
<% if (r.compensation) { %><dt>Compensation</dt><dd><a href="/operations/<%= it.tenant %>/<%= r.compensation.operationKey %>"><code><%= r.compensation.operationKey %></code></a> asked by <%= r.compensation.requestedBy.kind %> <%= r.compensation.requestedBy.id %><% if (r.compensation.errorClass) { %> · <%= r.compensation.errorClass %><% } %></dd><% } %>
<% } %>
</dl>
<% if (it.op) { %>
<h2>Receipt</h2>
<% if (it.op.receipt) { %>
<p id="receipt-check" class="<%= it.op.receipt.valid ? 'ok' : 'error' %>" data-valid="<%= it.op.receipt.valid %>"><%= it.op.receipt.valid ? 'Signature valid' : 'Signature NOT valid' %> (<code><%= it.op.receipt.keyId %></code>)</p>
<dl class="receipt"><% for (const [k, v] of it.op.receipt.fields) { %><dt><%= k %></dt><dd><code><%= v %></code></dd><% } %></dl>
<% } else { %><p id="receipt-check" data-valid="none">No receipt (nothing committed).</p><% } %>
<% if (it.op.takeover) { %>
<h2>Takeover</h2>
<dl class="takeover"><% for (const [k, v] of it.op.takeover) { %><dt><%= k %></dt><dd><%= v %></dd><% } %></dl>
<% } %>
<% if (it.op.compensation) { %>
<h2>Compensation</h2>
<dl class="compensation"><% for (const [k, v] of it.op.compensation) { %><dt><%= k %></dt><dd><%= v %></dd><% } %></dl>
<% } %>
<% } else if (it.who.kind === 'auditor') { %>
<p class="meta">Receipts are not shown to auditors: the record holds an HMAC of the result digest.</p>
<% } %>
<% if (r) { %>
<h2>Events</h2>
<table id="events"><thead><tr><th>#</th><th>at</th><th>event</th><th>state</th><th>attempt</th><th>actor</th><th>error class</th><th>by</th></tr></thead><tbody>
<% for (const s of r.states) { %><tr data-event="<%= s.event %>"><td><%= s.seq %></td><td><%= s.at %></td><td><%= s.event %></td><td><%~ include('@label', { status: s.status, labels: it.labels }) %></td><td><%= s.attempt %></td><td><%= s.actor %></td><td><%= s.errorClass ?? '' %></td><td><%= s.resolvedBy ? 'operator ' + s.resolvedBy : s.by ? s.by.kind + ' ' + s.by.id : '' %></td></tr><% } %>
</tbody></table>
<h2>Decisions</h2>
<% if (r.decisions.length === 0) { %><p class="meta">None.</p><% } else { %>
<table id="decisions"><thead><tr><th>at</th><th>actor</th><th>contract</th><th>outcome</th><th>policy</th></tr></thead><tbody>
<% for (const d of r.decisions) { %><tr><td><%= d.at %></td><td><%= d.actor %></td><td><%= d.contract ?? '' %></td><td><%= d.replayed ? 'replayed for ' + d.replayed.requestedBy.kind + ' ' + d.replayed.requestedBy.id : d.conflict ? 'idempotency_conflict' : d.errorClass ?? '' %></td><td><%= d.policyVersion ?? '' %></td></tr><% } %>
</tbody></table>
<% } %>
<h2>Audit record</h2>
<pre id="audit-record"><%= it.recordJson %></pre>
<% } %>`;

const OP = `<% layout('@layout') %>
<p><code id="operation-key"><%= it.operationKey %></code></p>
<% if (it.notice) { %><p class="ok" id="notice"><%= it.notice %></p><% } %>
<section id="live" data-refresh-ms="<%= it.refreshMs %>"><%~ include('@op-live', it) %></section>`;

const TAKEOVERS_LIVE = `<p class="meta">Updated <time><%= it.now %></time> · <%= it.rows.length %> open</p>
<table id="takeovers"><thead><tr><th>opened</th><th>tenant</th><th>operation</th><th>contract</th><th>state</th><th>reason</th><th>resolve</th></tr></thead><tbody>
<% for (const t of it.rows) { %>
<tr data-key="<%= t.operationKey %>" data-tenant="<%= t.tenant %>">
<td><%= t.openedAt %></td><td><%= t.tenant %></td>
<td><a href="/operations/<%= t.tenant %>/<%= t.operationKey %>"><code><%= t.operationKey %></code></a></td>
<td><%= t.contract %></td><td><%~ include('@label', { status: t.status, labels: it.labels }) %></td><td><%= t.reason %></td>
<td>
<% if (t.status === 'compensation_failed') { %>
<form method="post" action="/takeovers/resolve" class="inline"><input type="hidden" name="_csrf" value="<%= it.csrf %>"><input type="hidden" name="tenant" value="<%= t.tenant %>"><input type="hidden" name="operationKey" value="<%= t.operationKey %>"><button name="outcome" value="effect_kept">Effect kept</button><button name="outcome" value="undone_by_hand">Undone by hand</button></form>
<% } else { %>
<form method="post" action="/takeovers/resolve" class="inline"><input type="hidden" name="_csrf" value="<%= it.csrf %>"><input type="hidden" name="tenant" value="<%= t.tenant %>"><input type="hidden" name="operationKey" value="<%= t.operationKey %>"><input name="resourceId" placeholder="resource id found downstream" maxlength="200"><button name="outcome" value="committed">Committed</button></form>
<form method="post" action="/takeovers/resolve" class="inline"><input type="hidden" name="_csrf" value="<%= it.csrf %>"><input type="hidden" name="tenant" value="<%= t.tenant %>"><input type="hidden" name="operationKey" value="<%= t.operationKey %>"><button name="outcome" value="not_applied">Not applied</button></form>
<% } %>
</td>
</tr>
<% } %>
</tbody></table>`;

const TAKEOVERS = `<% layout('@layout') %>
<p class="meta">An unknown operation is resolved committed (with the resource id you verified downstream) or not applied; a failed compensation, effect kept or undone by hand (docs/operating.md "Recovery and takeover").</p>
<section id="live" data-refresh-ms="<%= it.refreshMs %>"><%~ include('@takeovers-live', it) %></section>`;

const CONTRACTS_TABLE = `<p class="meta">Updated <time><%= it.now %></time> · usage over the last 24 hours · <%= it.rows.length %> versions</p>
<table id="contracts"><thead><tr><th>contract</th><th>current</th><th>held</th><th>state</th><th>sunset</th><th>operations</th><th>tasks</th><th>actors</th><th>conflicts</th><th>rejected</th><th>unknown</th><th>ratio</th><th title="when a service holding it last published it (at its start, at most once a minute): not a call">last published</th></tr></thead><tbody>
<% for (const v of it.rows) { %>
<tr data-contract="<%= v.contract %>" data-state="<%= v.state %>"<% if (v.current) { %> data-current="1"<% } %>>
<td><code><%= v.contract %></code></td><td><% if (v.current) { %><span class="label st-committed">current</span><% } %></td>
<td class="held"><%= v.held ? 'yes' : 'no' %></td><td><span class="label st-<%= v.state %>"><%= v.state %></span></td><td><%= v.sunset %></td>
<td><%= v.usage.operations %></td><td><%= v.usage.tasks %></td><td><%= v.usage.actors %></td>
<td><%= v.usage.conflicts %></td><td><%= v.usage.rejected %></td><td><%= v.usage.unknown %></td><td class="ratio"><%= v.ratio %></td><td><%= v.lastSeen %></td>
</tr>
<% } %>
</tbody></table>`;

const CONTRACTS = `<% layout('@layout') %>
<p class="meta">Every registered contract version: the current one of each name, deprecations and retirements, and who still calls each (docs/contracts.md; change them with <code>tooltx contracts</code>). Not refreshed by itself: usage reads every audit record of the window; reload to count again.</p>
<section id="contracts-usage"><%~ include('@contracts-table', it) %></section>`;

const ERROR = `<% layout('@layout') %>
<p class="error" id="error" data-class="<%= it.error.class %>">Refused: <code><%= it.error.class %></code></p>
<% if (it.error.issues && it.error.issues.length) { %><ul id="issues"><% for (const i of it.error.issues) { %><li data-path="<%= i.path.join('.') %>"><code><%= i.path.join('.') || '(request)' %></code>: <%= i.code %> — <%= i.message %></li><% } %></ul><% } %>
<% if (it.error.retryAfterMs) { %><p>Try again in <%= Math.ceil(it.error.retryAfterMs / 1000) %> s.</p><% } %>
<p><% if (!it.who) { %><a href="/login">Log in</a><% } else if (it.back) { %><a href="/operations">Back to the operations</a><% } %></p>`;

export type Template =
  | 'login'
  | 'operations'
  | 'ops-live'
  | 'operation'
  | 'op-live'
  | 'takeovers'
  | 'takeovers-live'
  | 'contracts'
  | 'contracts-table'
  | 'error';

/** The compiled templates and the scrubber every page's values go through. */
export class ConsoleViews {
  readonly #eta = new Eta({ autoEscape: true, cache: true });
  readonly #scrub = scrubber(randomBytes(32));

  constructor() {
    const templates: Record<string, string> = {
      layout: LAYOUT,
      label: LABEL,
      login: LOGIN,
      operations: OPS,
      'ops-live': OPS_LIVE,
      operation: OP,
      'op-live': OP_LIVE,
      takeovers: TAKEOVERS,
      'takeovers-live': TAKEOVERS_LIVE,
      contracts: CONTRACTS,
      'contracts-table': CONTRACTS_TABLE,
      error: ERROR,
    };
    for (const [name, text] of Object.entries(templates)) this.#eta.loadTemplate(`@${name}`, text);
  }

  /** The page (or a live section alone) with `values` scrubbed as the logs scrub them. */
  render(template: Template, values: Record<string, unknown>): string {
    return this.#eta.render(`@${template}`, { ...(this.#scrub(values) as object), labels: STATUS_LABELS });
  }
}

export const CONSOLE_CSS = `body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1.2em;background:#1d2330;color:#fff}
header a{color:#cfe0ff;margin-right:1em}header .who{margin-left:auto;opacity:.85}
main{padding:1em 1.5em}h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse;background:#fff;width:100%}th,td{border-bottom:1px solid #e3e6eb;padding:.35em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}code{font-size:12px}.meta{color:#667}
form.filters{display:flex;flex-wrap:wrap;gap:.8em;margin-bottom:1em;align-items:end}form.filters label{display:flex;flex-direction:column;font-size:12px}
form.inline{display:inline-flex;gap:.3em;margin:0 .3em .2em 0}form.login{display:flex;flex-direction:column;gap:.7em;max-width:22em}
.label{display:inline-block;padding:.05em .5em;border-radius:1em;font-size:12px;background:#e3e6eb}
.st-committed{background:#d5f2dc}.st-unknown{background:#ffe9b3}.st-rejected,.st-refused{background:#f6d3d3}
.st-rolled_back{background:#dde3ff}.st-compensation_requested{background:#fff0c9}.st-compensated{background:#cdeef0}
.st-compensation_failed{background:#f4b8b8;font-weight:600}.st-awaiting_confirmation{background:#efe0ff}
.st-deprecated{background:#fff0c9}.st-retired,.st-withdrawn{background:#f6d3d3}
.error{color:#a00}.ok{color:#075}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{color:#556}dd{margin:0}
pre{background:#fff;border:1px solid #e3e6eb;padding:.7em;overflow:auto;max-height:30em}`;

export const CONSOLE_JS = `'use strict';
// Live pages: the section marked #live is read again every few seconds (the same page, its section
// alone), unless a field in it is being edited or the tab is hidden (an auditor's every read is a
// recorded audit query).
(() => {
  const live = document.getElementById('live');
  if (!live) return;
  const every = Number(live.dataset.refreshMs) || 2000;
  const tick = async () => {
    if (document.hidden) return;
    const a = document.activeElement;
    if (a && live.contains(a) && a.tagName === 'INPUT' && a.value) return;
    try {
      const r = await fetch(location.href, { headers: { 'x-console-live': '1' }, credentials: 'same-origin', redirect: 'manual' });
      if (r.ok) live.innerHTML = await r.text();
    } catch {}
  };
  setInterval(tick, every);
})();`;
