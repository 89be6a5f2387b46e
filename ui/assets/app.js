// execmesh control page. Vanilla JS, no build step; the one third-party
// code is xterm.js (xterm/, loaded by index.html before this file), for the
// terminal on a session.
//
// Every piece of server data reaches the page through textContent or
// setAttribute, never through the HTML parser: command lines and output
// are attacker-controllable text.
'use strict';

(() => {
  const TOKEN_KEY = 'execmesh.token';
  const SESSION_KEY_KEY = 'execmesh.sessionKey';
  const ALL_KEYS_KEY = 'execmesh.allKeys'; // '0': the operator chose one sessionKey
  const DEFAULT_SESSION_KEY = 'agent:main:main';
  const SESSION_KEY_RE = /^agent:[a-z0-9][a-z0-9_-]{0,63}:[A-Za-z0-9._:@/+=-]{1,190}$/;
  // LIST_CONCURRENCY bounds the process lists in flight when the table
  // shows every sessionKey.
  const LIST_CONCURRENCY = 8;
  const DECISIONS = ['allow-once', 'allow-always', 'deny'];
  const DECISION_LABELS = { 'allow-once': 'Allow once', 'allow-always': 'Allow always', deny: 'Deny' };
  // The API lives beside /ui: a page served at /x/ui/ calls /x/tools/invoke.
  const BASE = location.pathname.replace(/\/ui(\/.*)?$/, '');

  const $ = (id) => document.getElementById(id);

  const state = {
    token: null, // the bearer token in use ('' for a gateway without one)
    role: null, // 'operator' or 'agent', as GET /v1/whoami says
    authed: false,
    sessionKey: DEFAULT_SESSION_KEY,
    allKeys: false, // the operator's table shows every sessionKey (allKeysView)
    noKeyList: false, // the gateway has no GET /v1/sessions
    listSeq: 0, // numbers the session list reads
    listShown: 0, // the number of the read the table shows
    tail: null, // {id, sessionKey, done} of the session whose output is shown
    term: null, // the terminal's attachment (see openTerminal)
    sessions: [], // the sessions shown (each with its sessionKey), newest first
    filter: '', // the sessions filter, lower case
    page: 0, // the page of the (filtered) sessions shown
    pageSize: 25,
    knownKeys: new Set(), // sessionKeys to suggest
    timers: {},
    generation: 0, // bumped to stop every refresh loop
  };

  class ApiError extends Error {
    constructor(status, message, body) {
      super(message);
      this.status = status;
      this.body = body;
    }
  }

  // el builds an element; string children become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function setText(id, text, isError) {
    const e = $(id);
    e.textContent = text || '';
    e.classList.toggle('error', !!isError);
  }

  // api calls the gateway; a non-2xx answer throws an ApiError with the
  // gateway's message. A 401 while signed in returns to the token prompt.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    if (state.token) headers.Authorization = 'Bearer ' + state.token;
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(BASE + path, init);
    } catch (e) {
      throw new ApiError(0, 'Cannot reach the gateway: ' + e.message);
    }
    const raw = await resp.text();
    let data = null;
    if (raw) {
      try { data = JSON.parse(raw); } catch (e) { data = null; }
    }
    if (!resp.ok) {
      let msg = resp.status + ' ' + resp.statusText;
      if (data && data.error) msg = typeof data.error === 'string' ? data.error : (data.error.message || msg);
      if (resp.status === 401 && state.authed) signOut('The gateway rejected the token; enter it again.');
      // An operator action with the tool token (or none): say how to
      // become the operator here.
      if (resp.status === 403 && data && data.error && data.error.type === 'forbidden' && state.role !== 'operator') {
        msg = 'This needs the operator token. Choose “' + $('logout').textContent + '” and enter it (the file operator.token in the gateway’s state directory, e.g. ~/.execmesh/operator.token, or gateway.auth.operatorToken).';
      }
      throw new ApiError(resp.status, msg, data);
    }
    return data;
  }

  async function invoke(tool, args, sessionKey) {
    const d = await api('POST', '/tools/invoke', { tool, args, sessionKey: sessionKey || state.sessionKey });
    return d.result;
  }

  function resultText(res) {
    return (res && res.content ? res.content.map((c) => c.text || '').join('') : '');
  }

  // ---- token prompt --------------------------------------------------

  // probe asks the gateway what token is worth: {ok, role} where role is
  // 'operator' (everything) or 'agent' (tool calls; the tool token, or
  // none on a gateway without one), or {ok: false, err}.
  async function probe(token) {
    const saved = state.token;
    state.token = token;
    try {
      const d = await api('GET', '/v1/whoami');
      return { ok: true, role: d && d.role === 'operator' ? 'operator' : 'agent' };
    } catch (e) {
      return { ok: false, err: e };
    } finally {
      state.token = saved;
    }
  }

  function showLogin(message) {
    state.authed = false;
    state.token = null;
    state.role = null;
    stopTimers();
    clearData();
    $('app').hidden = true;
    $('logout').hidden = true;
    setText('conn-status', '');
    $('login').hidden = false;
    setText('login-error', message, true);
    $('token-input').value = '';
    $('token-input').focus();
  }

  function enter(token, role) {
    state.token = token;
    state.role = role;
    state.authed = true;
    sessionStorage.setItem(TOKEN_KEY, token);
    $('login').hidden = true;
    setText('login-error', '');
    $('app').hidden = false;
    $('logout').hidden = false;
    $('logout').textContent = role === 'operator' ? 'Change token' : 'Sign in as operator';
    $('conn-status').dataset.role = role;
    setText('conn-status', role === 'operator' ? 'connected as operator'
      : 'connected ' + (token ? 'with the tool token' : 'without a token') + ': approvals, pairing and settings need the operator token');
    // The operator sees every sessionKey unless they chose one in this tab.
    state.allKeys = role === 'operator' && sessionStorage.getItem(ALL_KEYS_KEY) !== '0';
    state.noKeyList = false;
    showScope();
    startTimers();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(message);
  }

  function loginError(err) {
    if (err.status === 401) return 'The gateway rejected this token.';
    if (err.status === 429) return 'Too many failed attempts; wait a minute and try again.';
    return err.message;
  }

  async function onTokenSubmit(ev) {
    ev.preventDefault();
    const token = $('token-input').value.trim();
    $('token-submit').disabled = true;
    try {
      const r = await probe(token);
      if (r.ok) enter(token, r.role);
      else setText('login-error', loginError(r.err), true);
    } finally {
      $('token-submit').disabled = false;
    }
  }

  // ---- refresh loops -------------------------------------------------

  // schedule runs fn every ms while the page is visible, until
  // stopTimers.
  function schedule(name, fn, ms) {
    const gen = state.generation;
    const loop = async () => {
      if (gen !== state.generation) return;
      if (document.visibilityState === 'visible') {
        try { await fn(); } catch (e) { /* each fn reports its own errors */ }
      }
      if (gen !== state.generation) return;
      state.timers[name] = setTimeout(loop, ms);
    };
    loop();
  }

  function stopTimers() {
    state.generation++;
    for (const t of Object.values(state.timers)) clearTimeout(t);
    state.timers = {};
  }

  function startTimers() {
    stopTimers();
    schedule('sessions', refreshSessions, 2000);
    schedule('approvals', refreshApprovals, 2000);
    schedule('nodes', refreshNodes, 5000);
    schedule('binding', refreshBinding, 5000);
    if (state.tail) followTail(state.tail);
  }

  function clearData() {
    closeTail();
    closeTerminal();
    state.sessions = [];
    for (const id of ['sessions-body', 'approvals-body', 'nodes-body', 'node-options']) $(id).replaceChildren();
    for (const id of ['sessions-status', 'sessions-result', 'approvals-status', 'approvals-result', 'nodes-status', 'bind-status', 'bind-current']) setText(id, '');
    $('run-output').hidden = true;
    $('run-output').textContent = '';
  }

  // syncRows updates tbody in place, one row per item keyed by key(item):
  // rows are reused rather than rebuilt, so a button stays the same
  // element across refreshes and a click is never lost.
  function syncRows(tbody, items, key, create, update, emptyText, columns) {
    const existing = new Map();
    for (const tr of tbody.querySelectorAll('tr[data-key]')) existing.set(tr.dataset.key, tr);
    const rows = [];
    for (const item of items) {
      const k = key(item);
      let tr = existing.get(k);
      if (tr) existing.delete(k);
      else {
        tr = create(item);
        tr.dataset.key = k;
      }
      update(tr, item);
      rows.push(tr);
    }
    if (rows.length === 0) rows.push(el('tr', { class: 'empty' }, el('td', { colspan: columns, text: emptyText })));
    tbody.replaceChildren(...rows);
  }

  // ---- sessions ------------------------------------------------------

  function fmtDuration(ms) {
    if (typeof ms !== 'number' || !isFinite(ms) || ms <= 0) return 'n/a';
    if (ms < 1000) return Math.round(ms) + 'ms';
    let s = Math.round(ms / 1000);
    const units = [['d', 86400], ['h', 3600], ['m', 60], ['s', 1]];
    const parts = [];
    for (const [u, n] of units) {
      if (s >= n) {
        parts.push(Math.floor(s / n) + u);
        s %= n;
      }
      if (parts.length === 2) break;
    }
    return parts.join('');
  }

  function fmtAgo(v) {
    let t = NaN;
    if (typeof v === 'number') t = v;
    else if (typeof v === 'string' && v) t = Date.parse(v);
    if (!isFinite(t) || t <= 0) return '';
    const d = Date.now() - t;
    return d < 1000 ? 'just now' : fmtDuration(d) + ' ago';
  }

  // allKeysView tells whether the table shows the sessions of every
  // sessionKey (the operator's, when GET /v1/sessions lists the keys)
  // rather than those of state.sessionKey.
  function allKeysView() {
    return state.role === 'operator' && state.allKeys && !state.noKeyList;
  }

  // viewName names what the table shows: '*' for every sessionKey (no
  // sessionKey is '*'), else the one key.
  function viewName() {
    return allKeysView() ? '*' : state.sessionKey;
  }

  // showScope shows the choice of every sessionKey to the operator only,
  // set as state says.
  function showScope() {
    const offered = state.role === 'operator' && !state.noKeyList;
    $('sessions-all-label').hidden = !offered;
    $('sessions-all').checked = allKeysView();
    $('sessions-hint').textContent = offered
      ? 'All sessionKeys lists the sessions of every sessionKey that holds some (GET /v1/sessions, then process list of each); Show lists the one key in the box, which the form above runs under.'
      : 'With the tool token the table shows one sessionKey at a time; the suggestions are the keys the gateway shows elsewhere (running gateway sessions, pending approvals) and those used in this tab.';
    $('sessions-filter').placeholder = offered ? 'command, status, id, sessionKey' : 'command, status, id';
  }

  function plural(n, one, many) {
    return n + ' ' + (n === 1 ? one : many);
  }

  // refreshSessions reads what the table shows and shows it, unless the
  // view changed meanwhile or a later read was shown already.
  async function refreshSessions() {
    const view = viewName();
    const seq = ++state.listSeq;
    const current = () => view === viewName() && seq > state.listShown;
    let r;
    try {
      r = view === '*' ? await listAllSessions() : { sessions: await listSessions(view) };
    } catch (e) {
      if (!current() || e.status === 401) return;
      if (view === '*' && e.status === 404) {
        // A gateway without GET /v1/sessions: one sessionKey at a time.
        state.noKeyList = true;
        showScope();
        setText('sessions-result', 'This gateway does not list sessionKeys (GET /v1/sessions not found): the table shows one sessionKey.');
        refreshSessions();
        return;
      }
      setText('sessions-status', e.message, true);
      return;
    }
    if (!current()) return;
    state.listShown = seq;
    state.sessions = r.sessions;
    let text = plural(r.sessions.length, 'session', 'sessions');
    if (view === '*') text += ' under ' + plural(r.keys, 'sessionKey', 'sessionKeys');
    text += ' · ' + new Date().toLocaleTimeString();
    if (r.failed && r.failed.length) {
      text += ' · not listed: ' + r.failed.map((f) => f.sessionKey + ' (' + f.message + ')').join(', ');
    }
    setText('sessions-status', text, !!(r.failed && r.failed.length));
    renderSessions();
  }

  // listSessions is the process list of sessionKey, each session marked
  // with the key.
  async function listSessions(sessionKey) {
    const res = await invoke('process', { action: 'list' }, sessionKey);
    const sessions = (res && res.details && res.details.sessions) || [];
    for (const s of sessions) s.sessionKey = sessionKey;
    return sessions;
  }

  // listAllSessions reads the sessionKeys that hold sessions (GET
  // /v1/sessions, the operator's), then the process list of each, at most
  // LIST_CONCURRENCY at a time, and merges them newest first. A key whose
  // list fails is left out and named in failed.
  async function listAllSessions() {
    const d = await api('GET', '/v1/sessions');
    const keys = ((d && d.sessionKeys) || []).map((k) => k && k.sessionKey).filter((k) => typeof k === 'string' && k);
    noteKeys(keys);
    const failed = [];
    const lists = await mapLimit(keys, LIST_CONCURRENCY, async (key) => {
      try {
        return await listSessions(key);
      } catch (e) {
        if (e.status === 401) throw e;
        failed.push({ sessionKey: key, message: e.message });
        return [];
      }
    });
    // A stable sort: sessions started in the same millisecond keep their
    // key's order, and the keys the gateway's (the busiest first).
    const sessions = lists.flat().sort((a, b) => startedAt(b) - startedAt(a));
    return { sessions, keys: keys.length, failed };
  }

  function startedAt(s) {
    return typeof s.startedAt === 'number' && isFinite(s.startedAt) ? s.startedAt : 0;
  }

  // mapLimit calls fn on every item, at most limit calls at a time, and
  // returns their results in the items' order.
  async function mapLimit(items, limit, fn) {
    const out = new Array(items.length);
    let next = 0;
    const worker = async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i], i);
      }
    };
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return out;
  }

  // sessionRowKey identifies a session's row: its sessionKey and id.
  function sessionRowKey(s) {
    return s.sessionKey + ' ' + s.sessionId;
  }

  // renderSessions shows the page of state.sessions that the filter and
  // the pager select: the list comes whole from process list (newest
  // first; of every key, merged, in the operator's view of all keys) and
  // is filtered and paged here.
  function renderSessions() {
    const all = allKeysView();
    $('sessions-table').dataset.scope = all ? 'all' : 'one';
    const f = state.filter;
    const list = f ? state.sessions.filter((s) => sessionMatches(s, f, all)) : state.sessions;
    const size = state.pageSize;
    const pages = Math.max(1, Math.ceil(list.length / size));
    state.page = Math.max(0, Math.min(state.page, pages - 1));
    const start = state.page * size;
    const items = list.slice(start, start + size);
    syncRows($('sessions-body'), items, sessionRowKey, sessionRow, updateSessionRow,
      f ? 'No session matches the filter.' : 'No running or recent sessions.', 8);
    const pager = $('sessions-pager');
    pager.hidden = pages === 1;
    pager.dataset.page = String(state.page + 1);
    pager.dataset.pages = String(pages);
    $('sessions-page').textContent = list.length
      ? (start + 1) + '–' + (start + items.length) + ' of ' + list.length + (f ? ' matching' : '') + ' · page ' + (state.page + 1) + ' of ' + pages
      : '';
    $('sessions-prev').disabled = state.page === 0;
    $('sessions-next').disabled = state.page >= pages - 1;
  }

  // sessionMatches: the filter is part of the session's command, status
  // (as shown: "completed · exit 3"), name, id or node, or of its
  // sessionKey when the table shows every key (withKey).
  function sessionMatches(s, filter, withKey) {
    return [s.command, visible(s.command || ''), statusLabel(s), s.name, s.sessionId, s.nodeName, s.nodeId, withKey ? s.sessionKey : null]
      .some((v) => v !== undefined && v !== null && String(v).toLowerCase().includes(filter));
  }

  function onFilterInput() {
    state.filter = $('sessions-filter').value.trim().toLowerCase();
    state.page = 0;
    renderSessions();
  }

  function onPageSizeChange() {
    const first = state.page * state.pageSize;
    state.pageSize = Number($('sessions-page-size').value) || 25;
    state.page = Math.floor(first / state.pageSize);
    renderSessions();
  }

  function turnPage(delta) {
    state.page += delta;
    renderSessions();
  }

  // ---- sessionKeys ----------------------------------------------------
  //
  // The key box suggests sessionKeys. To the operator, GET /v1/sessions
  // lists the keys that hold sessions (the view of every key reads it at
  // each refresh). The tool token cannot read that list: it gets the keys
  // the gateway shows it elsewhere, those of running gateway-host sessions
  // (GET /v1/admin/blockers) and of pending approvals. Both lists are read
  // when the key box gets the focus (they may be long); the keys used in
  // this tab are suggested too.

  function noteKeys(keys) {
    let changed = false;
    for (const k of keys) {
      if (typeof k === 'string' && SESSION_KEY_RE.test(k) && !state.knownKeys.has(k)) {
        state.knownKeys.add(k);
        changed = true;
      }
    }
    if (changed) $('session-keys').replaceChildren(...[...state.knownKeys].sort().map((k) => el('option', { value: k })));
  }

  let keysReadAt = 0;

  async function refreshKnownKeys() {
    if (Date.now() - keysReadAt < 5000) return;
    keysReadAt = Date.now();
    if (state.role === 'operator' && !state.noKeyList) {
      try {
        const d = await api('GET', '/v1/sessions');
        noteKeys(((d && d.sessionKeys) || []).map((k) => k && k.sessionKey));
        return;
      } catch (e) { /* an older gateway: the blockers then */ }
    }
    try {
      const d = await api('GET', '/v1/admin/blockers');
      noteKeys(((d && d.blockers) || []).map((b) => b.sessionKey));
    } catch (e) { /* suggestions only */ }
  }

  // sessionRow makes a session's row. Its buttons act on the session
  // under the row's own sessionKey (part of the row's identity, see
  // sessionRowKey), whichever key the key box holds. (Session ids are
  // unique across keys: the gateway's index reserves each.)
  function sessionRow(s) {
    const id = String(s.sessionId);
    const key = s.sessionKey;
    const kill = el('button', { type: 'button', class: 'danger', id: 'kill-' + id, 'data-testid': 'kill-' + id, title: 'Kill the process tree' }, 'Kill');
    kill.addEventListener('click', () => sessionAction(id, key, 'kill', kill));
    const remove = el('button', { type: 'button', id: 'remove-' + id, 'data-testid': 'remove-' + id, title: 'Forget this finished session' }, 'Remove');
    remove.addEventListener('click', () => sessionAction(id, key, 'remove', remove));
    const output = el('button', { type: 'button', id: 'tail-' + id, 'data-testid': 'tail-' + id }, 'Output');
    output.addEventListener('click', () => openTail(id, key));
    const terminal = el('button', { type: 'button', id: 'terminal-' + id, 'data-testid': 'terminal-' + id, title: 'Open a terminal on this session' }, 'Terminal');
    terminal.addEventListener('click', () => openTerminal(id, key));
    return el('tr', { 'data-testid': 'session-row', 'data-session-id': id, 'data-session-key': key },
      el('td', { class: 'mono', text: id }),
      el('td', { class: 'mono col-key', 'data-testid': 'session-row-key', title: key, text: key }),
      el('td', { 'data-testid': 'session-host' }),
      el('td', { 'data-testid': 'session-status' }),
      el('td', { 'data-testid': 'session-name' }),
      el('td', { 'data-testid': 'session-runtime' }),
      el('td', { class: 'command', 'data-testid': 'session-command' }),
      el('td', { class: 'actions' }, terminal, output, kill, remove));
  }

  // outcome names how a session ended, for its colour: only an exit 0 is
  // "ok" (green); a non-zero exit is "nonzero", a kill or a signal
  // "killed", and running and failed stay as they are.
  function outcome(d) {
    const st = String(d.status || '');
    if (st !== 'completed') return st.replace(/[^a-z-]/g, '');
    if (d.exitReason === 'manual-cancel' || d.exitSignal) return 'killed';
    if (d.exitCode !== undefined && d.exitCode !== null && d.exitCode !== 0) return 'nonzero';
    return 'ok';
  }

  // statusLabel is a session's status as the table shows it.
  function statusLabel(s) {
    const st = String(s.status || '');
    let label = st;
    if (s.exitReason === 'manual-cancel') label += ' · killed';
    else if (st !== 'running' && s.exitSignal) label += ' · ' + s.exitSignal;
    else if (st !== 'running' && s.exitCode !== undefined && s.exitCode !== null) label += ' · exit ' + s.exitCode;
    if (s.waitingForInput) label += ' · waiting for input';
    return label;
  }

  function updateSessionRow(tr, s) {
    const [, , host, status, name, runtime, command] = tr.cells;
    // Node sessions carry the node that runs them; the rest run on the
    // gateway (or in its sandbox).
    host.textContent = s.nodeId ? 'node ' + (s.nodeName || s.nodeId) : 'gateway';
    host.title = s.nodeId ? 'node id: ' + s.nodeId : '';
    const st = String(s.status || '');
    status.textContent = statusLabel(s);
    status.className = 'status-' + outcome(s);
    status.dataset.status = st;
    status.dataset.outcome = outcome(s);
    tr.dataset.status = st;
    name.textContent = s.name || '';
    runtime.textContent = fmtDuration(s.runtimeMs);
    // Commands and paths through visible() (visible.js): control and
    // bidi characters shown as escapes, never acted on by the page.
    command.textContent = visible(s.command || '');
    command.title = s.cwd ? 'cwd: ' + visible(s.cwd) : '';
    const running = st === 'running';
    tr.querySelector('[data-testid^="kill-"]').hidden = !running;
    tr.querySelector('[data-testid^="remove-"]').hidden = running;
  }

  async function sessionAction(id, sessionKey, action, button) {
    button.disabled = true;
    try {
      const res = await invoke('process', { action, sessionId: id }, sessionKey);
      setText('sessions-result', resultText(res), res.details && res.details.status === 'failed');
    } catch (e) {
      if (e.status !== 401) setText('sessions-result', e.message, true);
    } finally {
      button.disabled = false;
    }
    if (action === 'remove' && state.tail && state.tail.id === id && state.tail.sessionKey === sessionKey) closeTail();
    await refreshSessions();
  }

  function onSessionKeySubmit(ev) {
    ev.preventDefault();
    const key = $('session-key').value.trim() || DEFAULT_SESSION_KEY;
    if (!SESSION_KEY_RE.test(key)) {
      setText('sessions-status', 'A sessionKey looks like agent:<agentId>:<name>.', true);
      return;
    }
    state.sessionKey = key;
    $('session-key').value = key;
    sessionStorage.setItem(SESSION_KEY_KEY, key);
    noteKeys([key]);
    closeTail();
    // Show is the operator's choice of one key over all of them.
    if (state.role === 'operator') {
      state.allKeys = false;
      sessionStorage.setItem(ALL_KEYS_KEY, '0');
      showScope();
    }
    resetSessions();
  }

  // onAllKeysChange switches the operator's table between every
  // sessionKey and the one in the key box.
  function onAllKeysChange() {
    state.allKeys = $('sessions-all').checked;
    sessionStorage.setItem(ALL_KEYS_KEY, state.allKeys ? '1' : '0');
    showScope();
    resetSessions();
  }

  // resetSessions empties the table for another view and reads it.
  function resetSessions() {
    state.sessions = [];
    state.page = 0;
    $('sessions-body').replaceChildren();
    setText('sessions-status', '');
    setText('sessions-result', '');
    refreshSessions();
  }

  // ---- output tail ---------------------------------------------------
  //
  // The tail follows GET /v1/sessions/<sessionKey>/<id>/stream, the
  // gateway's server-sent events of one session: the gateway reads the
  // session with process log (never poll, which would drain the output
  // the agent has not read yet and acknowledge its exit notice) and pushes
  // what changed. EventSource cannot send the Authorization header, so the
  // stream is read with fetch and parsed here. #tail-panel's
  // data-transport is "stream" while the stream is open.

  const TAIL_RETRY_MS = 2000;

  // openTail shows the output of session id of sessionKey (the key box's
  // by default).
  function openTail(id, sessionKey) {
    closeTail();
    state.tail = { id, sessionKey: sessionKey || state.sessionKey, done: false, ctrl: null, retry: null };
    $('tail-panel').hidden = false;
    $('tail-panel').dataset.transport = '';
    $('tail-panel').dataset.sessionKey = state.tail.sessionKey;
    $('tail-title').textContent = id;
    $('tail-title').title = 'sessionKey: ' + state.tail.sessionKey;
    $('tail-output').textContent = '';
    setText('tail-status', '');
    setText('input-status', '');
    if (state.authed) followTail(state.tail);
  }

  function closeTail() {
    const tail = state.tail;
    state.tail = null;
    if (tail) {
      tail.done = true;
      if (tail.ctrl) tail.ctrl.abort();
      if (tail.retry) clearTimeout(tail.retry);
    }
    $('tail-panel').hidden = true;
  }

  // followTail (re)starts following the open tail unless it already is
  // followed or has ended.
  function followTail(tail) {
    if (!tail || tail.done || tail.ctrl) return;
    streamTail(tail);
  }

  function retryTail(tail) {
    if (state.tail !== tail || tail.done || tail.retry) return;
    tail.retry = setTimeout(() => {
      tail.retry = null;
      if (state.tail === tail && state.authed) followTail(tail);
    }, TAIL_RETRY_MS);
  }

  async function streamTail(tail) {
    const ctrl = new AbortController();
    tail.ctrl = ctrl;
    const headers = { Accept: 'text/event-stream' };
    if (state.token) headers.Authorization = 'Bearer ' + state.token;
    const path = '/v1/sessions/' + encodeURIComponent(tail.sessionKey) + '/' + encodeURIComponent(tail.id) + '/stream';
    try {
      const resp = await fetch(BASE + path, { headers, cache: 'no-store', signal: ctrl.signal });
      if (resp.ok) {
        if (state.tail !== tail) return;
        $('tail-panel').dataset.transport = 'stream';
        await readEvents(resp.body, (name, data) => onTailEvent(tail, name, data));
      } else if (!(await streamRefused(tail, resp))) {
        // Only what may pass later is retried (the gateway or the node
        // unavailable, a rate limit).
        return;
      }
    } catch (e) {
      if (ctrl.signal.aborted) return;
      if (state.tail === tail) setText('tail-status', 'Output stream interrupted: ' + e.message, true);
    } finally {
      if (tail.ctrl === ctrl) tail.ctrl = null;
    }
    // The stream ends after the final status (the tail is done then);
    // otherwise it was cut or refused for now: try again.
    retryTail(tail);
  }

  // streamRefused handles a non-2xx answer to the stream request and
  // tells whether to try again later.
  async function streamRefused(tail, resp) {
    let msg = resp.status + ' ' + resp.statusText;
    try {
      const d = await resp.json();
      if (d && d.error) msg = typeof d.error === 'string' ? d.error : (d.error.message || msg);
    } catch (e) { /* not JSON */ }
    if (state.tail !== tail) return false;
    if (resp.status === 401) {
      tail.done = true;
      if (state.authed) signOut('The gateway rejected the token; enter it again.');
      return false;
    }
    if (resp.status === 404) tail.done = true; // unknown session: no retry
    setText('tail-status', msg, true);
    return resp.status === 429 || resp.status >= 500;
  }

  // readEvents parses a text/event-stream body and calls onEvent(name,
  // data) for each event; comments (heartbeats) are skipped.
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n?/g, '\n');
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line === '' || line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? '' : line.slice(colon + 1);
          if (v.startsWith(' ')) v = v.slice(1);
          if (field === 'event') name = v;
          else if (field === 'data') data.push(v);
        }
        if (data.length) onEvent(name, data.join('\n'));
      }
    }
  }

  // TAIL_KEEP is how much output the live tail keeps: the session core's
  // retention cap.
  const TAIL_KEEP = 200000;

  function onTailEvent(tail, name, raw) {
    if (state.tail !== tail) return;
    let d;
    try { d = JSON.parse(raw); } catch (e) { return; }
    const out = $('tail-output');
    const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    if (name === 'output') {
      if (typeof d.reset === 'string') out.textContent = d.reset;
      else if (typeof d.append === 'string') {
        out.append(d.append);
        // The stream keeps appending after the retention cap dropped the
        // start of the output; the view keeps the newest TAIL_KEEP chars.
        if (out.textContent.length > 2 * TAIL_KEEP) out.textContent = out.textContent.slice(-TAIL_KEEP);
      }
      if (atBottom) out.scrollTop = out.scrollHeight;
    } else if (name === 'status') {
      const st = String(d.status || '');
      let label = st;
      if (st !== 'running') {
        if (d.exitReason === 'manual-cancel') label += ' · killed';
        else if (d.exitSignal) label += ' · ' + d.exitSignal;
        else if (d.exitCode !== undefined && d.exitCode !== null) label += ' · exit ' + d.exitCode;
      }
      if (d.waitingForInput) label += ' · waiting for input';
      setText('tail-status', label, st === 'failed');
      $('tail-status').dataset.status = st;
      $('tail-status').dataset.outcome = outcome(d);
      $('tail-status').classList.toggle('status-nonzero', outcome(d) === 'nonzero');
      $('tail-status').classList.toggle('status-killed', outcome(d) === 'killed');
      if (st !== 'running') {
        // The last event: a finished session's output no longer changes.
        tail.done = true;
        refreshSessions();
      }
    } else if (name === 'error') {
      setText('tail-status', String(d.error || 'output stream failed'), true);
    }
  }

  async function onInputSubmit(ev) {
    ev.preventDefault();
    if (!state.tail) return;
    const { id, sessionKey } = state.tail;
    const data = $('input-text').value;
    $('input-send').disabled = true;
    try {
      const msgs = [];
      if (data !== '') {
        const res = await invoke('process', { action: 'write', sessionId: id, data }, sessionKey);
        msgs.push(resultText(res));
        if (res.details && res.details.status === 'failed') throw new ApiError(200, msgs.join(' '));
      }
      if ($('input-enter').checked) msgs.push(resultText(await invoke('process', { action: 'submit', sessionId: id }, sessionKey)));
      $('input-text').value = '';
      setText('input-status', msgs.join(' '));
    } catch (e) {
      if (e.status !== 401) setText('input-status', e.message, true);
    } finally {
      $('input-send').disabled = false;
    }
  }

  // ---- terminal ------------------------------------------------------
  //
  // A terminal (xterm.js) on one session at a time, over the gateway's
  // attach WebSocket: GET /v1/sessions/<id>/attach joins a running session
  // (read-write when no other client holds its input), GET /v1/exec/attach
  // starts a command on a PTY attached from its first byte. Binary
  // messages are data, their first byte the kind (0 stdin, 1 stdout, 2
  // stderr); text messages are JSON controls (started, exit, result,
  // error from the gateway; resize, signal, eof from the page). A browser
  // cannot set Authorization on a WebSocket: the token goes as a second
  // subprotocol, execmesh.bearer.<token>, beside execmesh.attach.v1.
  //
  // A socket's output starts when it attaches, so the screen is first
  // filled with the session's retained log (process log, which drains
  // nothing the agent has not read). The Terminal is made once and kept;
  // #term-screen's terminal property is it (tests read its buffer there).
  // #term-card's data-state is connecting, attached, exited or closed,
  // data-mode rw or ro.

  const ATTACH_PROTOCOL = 'execmesh.attach.v1';
  const BEARER_PROTOCOL = 'execmesh.bearer.';
  const KIND_STDIN = 0;
  const KIND_STDOUT = 1;
  const KIND_STDERR = 2;
  const STDIN_CHUNK = 64 * 1024; // the gateway takes up to 256 KiB a frame
  const LOG_LINES = 1000; // how much of the log fills the screen
  const CLOSE_TEXT = {
    1001: 'the gateway is shutting down',
    1006: 'the connection was lost',
    1008: 'the gateway refused a message',
    1009: 'a message was too big',
    1011: 'the gateway failed',
    4008: 'the page did not take the output fast enough',
    4010: 'the stream was lost: the session’s host stopped answering',
  };
  const encoder = new TextEncoder();

  let xterm = null; // {term, fit} once made

  function dim(s) { return '\x1b[2m' + s + '\x1b[22m'; }

  // ensureXterm makes the Terminal in #term-screen, which must be shown.
  function ensureXterm() {
    if (xterm) return xterm;
    if (typeof Terminal !== 'function' || typeof FitAddon !== 'object' || typeof CanvasAddon !== 'object') {
      throw new Error('xterm.js did not load');
    }
    const screen = $('term-screen');
    const term = new Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: '#111418', foreground: '#e6e8eb', cursor: '#e6e8eb', selectionBackground: '#3a4556' },
    });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    // Loaded before open, the canvas renderer takes the place of the DOM
    // renderer, whose <style> elements the page's CSP refuses.
    term.loadAddon(new CanvasAddon.CanvasAddon());
    term.open(screen);
    term.onData((s) => termInput(encoder.encode(s)));
    term.onBinary((s) => termInput(Uint8Array.from(s, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(({ cols, rows }) => sendResize(cols, rows));
    new ResizeObserver(() => scheduleFit()).observe(screen);
    screen.terminal = term;
    xterm = { term, fit, fitPending: false };
    return xterm;
  }

  // scheduleFit fits the grid to #term-screen at the next frame; a new
  // size goes to the session (term.onResize).
  function scheduleFit() {
    if (!xterm || xterm.fitPending) return;
    xterm.fitPending = true;
    requestAnimationFrame(() => {
      xterm.fitPending = false;
      // A hidden box measures 0: fitting it would squeeze the grid.
      if ($('term-card').hidden || $('term-screen').clientWidth === 0) return;
      try { xterm.fit.fit(); } catch (e) { /* not measurable yet */ }
    });
  }

  function setTermStatus(text, isError) {
    setText('term-status', text, isError);
  }

  function setTermState(t, st) {
    if (state.term === t) $('term-card').dataset.state = st;
  }

  function setTermMode(mode) {
    const m = $('term-mode');
    m.textContent = mode === 'rw' ? 'read-write' : mode === 'ro' ? 'read-only' : '';
    m.className = 'badge ' + (mode || '');
    $('term-card').dataset.mode = mode || '';
  }

  // showTerminal opens the panel for a new attachment t.
  function showTerminal(t, title) {
    closeTerminal();
    state.term = t;
    const card = $('term-card');
    card.hidden = false;
    card.dataset.state = 'connecting';
    delete card.dataset.closeCode;
    delete card.dataset.exitCode;
    delete card.dataset.status;
    $('term-title').textContent = title;
    $('term-title').title = 'sessionKey: ' + t.sessionKey;
    card.dataset.sessionKey = t.sessionKey;
    $('term-reattach').hidden = true;
    $('term-interrupt').disabled = true;
    setTermMode('');
    setTermStatus('');
    let x;
    try {
      x = ensureXterm();
    } catch (e) {
      setTermStatus(e.message, true);
      state.term = null;
      return null;
    }
    x.term.reset();
    x.term.options.disableStdin = true;
    x.term.options.convertEol = false;
    try { x.fit.fit(); } catch (e) { /* fitted at the next resize */ }
    card.scrollIntoView({ block: 'nearest' });
    return x.term;
  }

  // openTerminal shows session id of sessionKey (the chosen one by
  // default) in the terminal: its retained log, then its live streams.
  async function openTerminal(id, sessionKey) {
    const t = { id, sessionKey: sessionKey || state.sessionKey, ws: null, exec: false };
    const term = showTerminal(t, id);
    if (!term) return;
    setTermStatus('Reading the log…');
    try {
      const res = await invoke('process', { action: 'log', sessionId: id, limit: LOG_LINES }, t.sessionKey);
      if (state.term !== t) return;
      const text = logText(res);
      if (text) term.write(text.replace(/\r?\n/g, '\r\n'));
    } catch (e) {
      if (state.term !== t) return;
      if (e.status === 401) return;
      term.write(dim('[no log: ' + e.message + ']') + '\r\n');
    }
    setTermStatus('Attaching…');
    attachSession(t, true);
  }

  // logText is the screen's part of a process log answer: the output,
  // without the hint the log adds for a session that waits for input.
  function logText(res) {
    let text = resultText(res);
    const hint = text.lastIndexOf('\n\nNo new output for ');
    if (hint >= 0 && text.indexOf('may be waiting for input', hint) > 0) text = text.slice(0, hint);
    if (text === '(no output yet)' || text === '(no output recorded)') return '';
    return text;
  }

  function attachPath(t, write) {
    const q = new URLSearchParams({ sessionKey: t.sessionKey });
    if (write) q.set('write', '1');
    return '/v1/sessions/' + encodeURIComponent(t.id) + '/attach?' + q.toString();
  }

  // attachSession attaches t to its session, asking for its input when
  // write is set.
  function attachSession(t, write) {
    connect(t, attachPath(t, write), { write });
  }

  // runInTerminal starts exec args on a PTY over GET /v1/exec/attach. The
  // session is kept when the terminal closes (keepOnDetach): it is listed
  // with the others and can be attached again or killed.
  function runInTerminal(args) {
    const t = { id: '', sessionKey: state.sessionKey, ws: null, exec: true };
    const exec = Object.assign({}, args, { pty: true });
    if (!showTerminal(t, visible(args.command))) return;
    setTermStatus('Starting…');
    connect(t, '/v1/exec/attach', { start: { type: 'start', exec, sessionKey: t.sessionKey, keepOnDetach: true } });
  }

  // connect opens the socket of t. opts.write: a writer was asked for;
  // opts.start: the start frame to send once open.
  function connect(t, path, opts) {
    const protocols = [ATTACH_PROTOCOL];
    if (state.token) protocols.push(BEARER_PROTOCOL + state.token);
    let ws;
    try {
      ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + BASE + path, protocols);
    } catch (e) {
      setTermStatus('Cannot open the terminal socket: ' + e.message, true);
      setTermState(t, 'closed');
      return;
    }
    ws.binaryType = 'arraybuffer';
    t.ws = ws;
    t.opened = false;
    t.started = false;
    t.writer = false;
    t.pty = false;
    t.exited = false;
    const mine = () => state.term === t && t.ws === ws;
    ws.addEventListener('open', () => {
      if (!mine()) return;
      t.opened = true;
      if (opts.start) ws.send(JSON.stringify(opts.start));
    });
    ws.addEventListener('message', (ev) => { if (mine()) onTermMessage(t, ev.data); });
    ws.addEventListener('close', (ev) => { if (mine()) onTermClose(t, ev, opts); });
  }

  function onTermMessage(t, data) {
    const term = xterm.term;
    if (data instanceof ArrayBuffer) {
      const b = new Uint8Array(data);
      if (b.length === 0) return;
      if (b[0] === KIND_STDOUT) term.write(b.subarray(1));
      else if (b[0] === KIND_STDERR) {
        // stderr of a pipe session, tinted (a PTY has none).
        term.write('\x1b[91m');
        term.write(b.subarray(1));
        term.write('\x1b[39m');
      }
      return;
    }
    let c;
    try { c = JSON.parse(data); } catch (e) { return; }
    if (!c || typeof c !== 'object') return;
    if (c.type === 'started') onStarted(t, c);
    else if (c.type === 'exit') onExit(t, c);
    else if (c.type === 'result') onResult(t, c);
    else if (c.type === 'error') {
      const msg = String(c.error || 'refused');
      t.lastError = msg;
      setTermStatus(msg, true);
      if (!t.started) term.write('\x1b[91m' + msg.replace(/\r?\n/g, '\r\n') + '\x1b[39m\r\n');
    }
  }

  function onStarted(t, c) {
    const term = xterm.term;
    t.started = true;
    if (c.sessionId) t.id = String(c.sessionId);
    t.writer = !!c.writer;
    t.pty = !!c.pty;
    $('term-title').textContent = t.id;
    $('term-card').dataset.sessionId = t.id;
    // A pipe's output ends lines with a bare \n.
    term.options.convertEol = !t.pty;
    term.options.disableStdin = !t.writer;
    setTermMode(t.writer ? 'rw' : 'ro');
    $('term-interrupt').disabled = !t.writer;
    setTermState(t, 'attached');
    if (t.writer) setTermStatus(t.exec ? 'started' : 'attached');
    else setTermStatus(t.readOnlyWhy || 'attached read-only: typing does nothing');
    if (t.writer && t.pty) {
      t.sentSize = '';
      try { xterm.fit.fit(); } catch (e) { /* measured later */ }
      sendResize(term.cols, term.rows);
    }
    if (t.exec) refreshSessions();
    term.focus();
  }

  function exitLabel(c) {
    const st = String(c.status || 'ended');
    if (c.reason === 'manual-cancel') return st + ' · killed';
    if (c.signal) return st + ' · ' + c.signal;
    if (c.exitCode !== undefined && c.exitCode !== null) return st + ' · exit ' + c.exitCode;
    return st;
  }

  function onExit(t, c) {
    t.exited = true;
    const label = exitLabel(c);
    xterm.term.write('\r\n' + dim('[session ' + t.id + ': ' + label + ']') + '\r\n');
    const card = $('term-card');
    card.dataset.status = String(c.status || '');
    if (c.exitCode !== undefined && c.exitCode !== null) card.dataset.exitCode = String(c.exitCode);
    setTermState(t, 'exited');
    $('term-interrupt').disabled = true;
    setTermStatus(label, c.status === 'failed');
    xterm.term.options.disableStdin = true;
    refreshSessions();
  }

  // onResult: the start left no running session (it waits for an
  // approval, or policy refused it); the exec tool's answer is shown.
  function onResult(t, c) {
    t.exited = true;
    const res = c.result || {};
    const d = res.details || {};
    xterm.term.write(resultText(res).replace(/\r?\n/g, '\r\n') + '\r\n');
    $('term-card').dataset.status = String(d.status || '');
    setTermState(t, 'exited');
    setTermStatus(d.status === 'approval-pending' ? 'waiting for an approval: the command runs in the background once allowed' : String(d.status || 'not started'), d.status === 'failed');
    if (d.status === 'approval-pending') refreshApprovals();
    refreshSessions();
  }

  function onTermClose(t, ev, opts) {
    t.ws = null;
    const card = $('term-card');
    card.dataset.closeCode = String(ev.code);
    xterm.term.options.disableStdin = true;
    $('term-interrupt').disabled = true;
    if (!t.opened) {
      // The handshake failed, and a browser does not say why. A writer
      // is refused (409) while another client holds the input: attach
      // read-only then. Anything else fails read-only too.
      if (opts.write) {
        t.readOnlyWhy = 'read-only: another client holds this session’s input';
        attachSession(t, false);
        return;
      }
      setTermState(t, 'closed');
      setTermStatus((t.exec ? 'Could not start: ' : 'Could not attach to ' + t.id + ': ') +
        'the gateway refused the socket (the session may be gone, or the token may not reach it).', true);
      $('term-reattach').hidden = t.exec;
      return;
    }
    if (t.exited) return; // the exit (or result) said it all
    setTermState(t, 'closed');
    const why = ev.reason || CLOSE_TEXT[ev.code] || t.lastError || '';
    const msg = 'disconnected (' + ev.code + (why ? ': ' + why : '') + ')';
    xterm.term.write('\r\n' + dim('[' + msg + ']') + '\r\n');
    setTermStatus(msg, true);
    $('term-reattach').hidden = !t.id;
  }

  // closeTerminal detaches: the session keeps running.
  function closeTerminal() {
    const t = state.term;
    state.term = null;
    if (t && t.ws) {
      try { t.ws.close(1000, 'detached'); } catch (e) { /* closing already */ }
    }
    $('term-card').hidden = true;
    $('term-card').dataset.state = 'closed';
  }

  // termInput sends what was typed: stdin bytes. On a pipe, Ctrl-C and
  // Ctrl-D become a SIGINT and an end of input; on a PTY they are bytes
  // like any other, which its line discipline turns into both.
  function termInput(bytes) {
    const t = state.term;
    if (!t || !t.started || !t.writer || t.exited || !t.ws || t.ws.readyState !== WebSocket.OPEN) return;
    if (!t.pty && bytes.length === 1 && (bytes[0] === 3 || bytes[0] === 4)) {
      t.ws.send(JSON.stringify(bytes[0] === 3 ? { type: 'signal', signal: 'SIGINT' } : { type: 'eof' }));
      return;
    }
    for (let i = 0; i < bytes.length; i += STDIN_CHUNK) {
      const part = bytes.subarray(i, i + STDIN_CHUNK);
      const msg = new Uint8Array(part.length + 1);
      msg[0] = KIND_STDIN;
      msg.set(part, 1);
      t.ws.send(msg);
    }
  }

  // sendResize tells a PTY session the terminal's size (its input holder
  // only: the gateway refuses it from a reader).
  function sendResize(cols, rows) {
    const t = state.term;
    if (!t || !t.started || !t.writer || !t.pty || t.exited || !t.ws || t.ws.readyState !== WebSocket.OPEN) return;
    const size = cols + 'x' + rows;
    if (t.sentSize === size) return;
    t.sentSize = size;
    t.ws.send(JSON.stringify({ type: 'resize', cols, rows }));
    $('term-card').dataset.size = size;
  }

  // ---- run a command -------------------------------------------------

  async function onRunSubmit(ev) {
    ev.preventDefault();
    const args = { command: $('run-command').value };
    const workdir = $('run-workdir').value.trim();
    const host = $('run-host').value;
    const node = $('run-node').value.trim();
    if (workdir) args.workdir = workdir;
    if (host) args.host = host;
    if (node) args.node = node;
    if ($('run-terminal').checked) {
      $('run-output').hidden = true;
      runInTerminal(args);
      return;
    }
    if ($('run-background').checked) args.background = true;
    const out = $('run-output');
    out.hidden = false;
    out.classList.remove('error');
    out.textContent = 'Running…';
    $('run-submit').disabled = true;
    try {
      const res = await invoke('exec', args);
      const d = res.details || {};
      out.textContent = resultText(res);
      out.classList.toggle('error', d.status === 'failed');
      if (d.status === 'running' && d.sessionId) openTail(String(d.sessionId));
      if (d.status === 'approval-pending') refreshApprovals();
      refreshSessions();
    } catch (e) {
      out.textContent = e.message;
      out.classList.add('error');
    } finally {
      $('run-submit').disabled = false;
    }
  }

  // ---- approvals -----------------------------------------------------

  async function refreshApprovals() {
    let d;
    try {
      d = await api('GET', '/v1/approvals');
    } catch (e) {
      if (e.status === 401) return;
      setText('approvals-status', e.status === 404 ? 'This gateway does not list approvals (GET /v1/approvals not found).' : e.message, e.status !== 404);
      $('approvals-body').replaceChildren();
      return;
    }
    const list = (d && d.approvals) || [];
    noteKeys(list.map((a) => a.sessionKey));
    setText('approvals-status', list.length ? '' : 'No pending approvals.');
    syncRows($('approvals-body'), list, (a) => a.id, approvalRow, updateApprovalRow, 'Nothing waits for a decision.', 6);
  }

  function approvalRow(a) {
    const id = String(a.id);
    const decisions = Array.isArray(a.decisions) && a.decisions.length ? a.decisions.filter((x) => DECISIONS.includes(x)) : DECISIONS;
    const buttons = decisions.map((decision) => {
      const b = el('button', {
        type: 'button',
        class: decision === 'deny' ? 'danger' : 'ok',
        id: 'approve-' + decision + '-' + id,
        'data-testid': 'approve-' + decision + '-' + id,
        'data-decision': decision,
      }, DECISION_LABELS[decision]);
      b.addEventListener('click', () => decide(id, decision, a.command, buttons));
      return b;
    });
    return el('tr', { 'data-testid': 'approval-row', 'data-approval-id': id },
      el('td', { class: 'command', 'data-testid': 'approval-command' }),
      el('td', { 'data-testid': 'approval-host' }),
      el('td', { class: 'mono', 'data-testid': 'approval-cwd' }),
      el('td', { 'data-testid': 'approval-agent' }),
      el('td', { 'data-testid': 'approval-expires' }),
      el('td', { class: 'actions' }, ...buttons));
  }

  function updateApprovalRow(tr, a) {
    const [command, host, cwd, agent, expires] = tr.cells;
    // What the operator approves is what they see: control and bidi
    // characters as escapes (visible.js).
    command.textContent = visible(a.command || '');
    host.textContent = (a.host || '') + (a.nodeId ? ' · ' + a.nodeId : '');
    cwd.textContent = visible(a.cwd || '');
    agent.textContent = a.agentId || '';
    agent.title = a.sessionKey || '';
    const left = typeof a.expiresAtMs === 'number' ? a.expiresAtMs - Date.now() : NaN;
    expires.textContent = isFinite(left) ? (left > 0 ? 'in ' + fmtDuration(left) : 'expired') : '';
  }

  async function decide(id, decision, command, buttons) {
    for (const b of buttons) b.disabled = true;
    try {
      await api('POST', '/v1/approvals/' + encodeURIComponent(id), { decision });
      setText('approvals-result', DECISION_LABELS[decision] + ': ' + visible(command || id));
    } catch (e) {
      if (e.status === 401) return;
      const msg = e.status === 404 ? 'That approval expired or is unknown.'
        : e.status === 409 ? 'That approval was already decided.' : e.message;
      setText('approvals-result', msg, true);
    } finally {
      for (const b of buttons) b.disabled = false;
    }
    await refreshApprovals();
    refreshSessions();
  }

  // ---- nodes ---------------------------------------------------------

  async function refreshNodes() {
    let d;
    try {
      d = await api('GET', '/v1/nodes');
    } catch (e) {
      if (e.status === 401) return;
      setText('nodes-status', e.status === 404 ? 'This gateway has no node registry (GET /v1/nodes not found).' : e.message, e.status !== 404);
      $('nodes-body').replaceChildren();
      return;
    }
    const nodes = (d && d.nodes) || [];
    setText('nodes-status', nodes.length ? '' : 'No node agents known.');
    syncRows($('nodes-body'), nodes, (n) => n.id, nodeRow, updateNodeRow, 'No node agents.', 7);
    $('node-options').replaceChildren(...nodes.flatMap((n) => {
      const opts = [el('option', { value: n.id })];
      if (n.name && n.name !== n.id) opts.push(el('option', { value: n.name }));
      return opts;
    }));
  }

  function nodeRow(n) {
    return el('tr', { 'data-testid': 'node-row', 'data-node-id': String(n.id) },
      el('td', { class: 'mono' }), el('td'), el('td', { 'data-testid': 'node-status' }), el('td'), el('td'), el('td'), el('td'));
  }

  function updateNodeRow(tr, n) {
    const [id, name, status, paired, platform, seen, sessions] = tr.cells;
    id.textContent = n.id || '';
    name.textContent = n.name || '';
    status.textContent = n.status || '';
    status.className = 'status-' + String(n.status || '').replace(/[^a-z-]/g, '');
    paired.textContent = n.paired === undefined ? '' : (n.paired ? 'yes' : 'no');
    platform.textContent = n.platform || '';
    seen.textContent = fmtAgo(n.lastSeen);
    sessions.textContent = Array.isArray(n.sessions) ? String(n.sessions.length) : (n.sessions ?? '');
  }

  // refreshBinding shows the bindings in force: GET /v1/config/exec-node
  // answers {"default": node, "agents": {agentId: node}}.
  async function refreshBinding() {
    let b;
    try {
      b = await api('GET', '/v1/config/exec-node');
    } catch (e) {
      if (e.status !== 401) setText('bind-current', '');
      return;
    }
    showBinding(b);
  }

  function showBinding(b) {
    if (!b || typeof b !== 'object') return;
    const parts = ['all agents → ' + (b['default'] || '(none)')];
    for (const [agent, node] of Object.entries(b.agents || {})) {
      if (node) parts.push(agent + ' → ' + node);
    }
    setText('bind-current', 'In force: ' + parts.join('; '));
  }

  async function onBindSubmit(ev) {
    ev.preventDefault();
    const agentId = $('bind-agent').value.trim();
    const node = $('bind-node').value.trim();
    $('bind-save').disabled = true;
    try {
      showBinding(await api('PUT', '/v1/config/exec-node', { agentId, node }));
      const who = agentId ? 'agent ' + agentId : 'all agents';
      setText('bind-status', node ? 'Saved: ' + who + ' → ' + node : 'Saved: no default node for ' + who);
    } catch (e) {
      if (e.status === 401) return;
      // The gateway's answer for a route it does not have.
      const noRoute = e.status === 404 && e.message.startsWith('not found: /');
      setText('bind-status', noRoute ? 'This gateway has no PUT /v1/config/exec-node.' : e.message, true);
    } finally {
      $('bind-save').disabled = false;
    }
  }

  // ---- start ---------------------------------------------------------

  function bindEvents() {
    $('token-form').addEventListener('submit', onTokenSubmit);
    $('logout').addEventListener('click', () => signOut(''));
    $('key-form').addEventListener('submit', onSessionKeySubmit);
    $('tail-close').addEventListener('click', closeTail);
    $('input-form').addEventListener('submit', onInputSubmit);
    $('run-form').addEventListener('submit', onRunSubmit);
    $('session-key').addEventListener('focus', refreshKnownKeys);
    $('sessions-all').addEventListener('change', onAllKeysChange);
    $('sessions-filter').addEventListener('input', onFilterInput);
    $('sessions-page-size').addEventListener('change', onPageSizeChange);
    $('sessions-prev').addEventListener('click', () => turnPage(-1));
    $('sessions-next').addEventListener('click', () => turnPage(1));
    $('term-close').addEventListener('click', closeTerminal);
    $('term-interrupt').addEventListener('click', () => { termInput(Uint8Array.of(3)); if (xterm) xterm.term.focus(); });
    $('term-reattach').addEventListener('click', () => { if (state.term && state.term.id) openTerminal(state.term.id, state.term.sessionKey); });
    $('bind-form').addEventListener('submit', onBindSubmit);
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible' && state.authed) startTimers();
    });
  }

  async function start() {
    bindEvents();
    const key = sessionStorage.getItem(SESSION_KEY_KEY);
    if (key && SESSION_KEY_RE.test(key)) state.sessionKey = key;
    $('session-key').value = state.sessionKey;
    noteKeys([DEFAULT_SESSION_KEY, state.sessionKey]);
    state.pageSize = Number($('sessions-page-size').value) || 25;
    // Without a stored token, try the API without one first: a loopback
    // gateway without auth needs no prompt.
    const stored = sessionStorage.getItem(TOKEN_KEY);
    const r = await probe(stored === null ? '' : stored);
    if (r.ok) {
      enter(stored === null ? '' : stored, r.role);
      return;
    }
    if (stored !== null) sessionStorage.removeItem(TOKEN_KEY);
    if (r.err.status === 401) showLogin(stored ? 'The stored token was rejected; enter it again.' : '');
    else showLogin(loginError(r.err));
  }

  start();
})();
