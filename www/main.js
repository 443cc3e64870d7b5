// The bq-dedupe playground: the package's `web` build (www/pkg/, copied there by
// scripts/build-js.sh) driving an envelope editor, a delivery timeline, the
// conformance suite and sequence import/export. No framework, no build step.
import { memoryStore, persistentStore, workerStore, workerAvailable } from './stores.js';

const $ = (id) => document.getElementById(id);
const SETTINGS_KEY = 'bq-dedupe-playground:settings';
const DEFAULT_ENVELOPE = {
  job: 'urn:babel:orders:created',
  trace_id: '7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b',
  data: { order_id: 1042 },
  meta: { id: 'order-1042', queue: 'orders', lang: 'js', schema_version: 1, created_at: 1749132727000 },
  attempts: 0,
};

function showError(message) {
  const banner = $('error-banner');
  banner.textContent = message;
  banner.hidden = false;
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

/** The playground's five decisions (plus store-unavailable) from the core's outcome code. */
function decisionOf(kind) {
  switch (kind) {
    case 'run-ok': case 'run-ok-unrecorded': case 'run-ok-lease-lost': case 'run-failed': case 'run-panicked': return 'run';
    case 'skip': return 'skip';
    case 'fail-open': case 'fail-open-failed': return 'fail-open';
    case 'park': return 'park';
    case 'rejected': return 'rejected';
    default: return kind;
  }
}

function loadSettings() {
  try { return JSON.parse(localStorage.getItem(SETTINGS_KEY)) ?? {}; } catch { return {}; }
}

async function main() {
  const controls = [...document.querySelectorAll('button, select, input, textarea')];
  controls.forEach((c) => { c.disabled = true; });

  let bq;
  let conformance;
  try {
    bq = await import('./pkg/bq_dedupe.js');
    conformance = await import('./pkg/conformance.js');
    await bq.default({ module_or_path: new URL('./pkg/bq_dedupe_bg.wasm', import.meta.url) });
  } catch (e) {
    showError(`The WebAssembly module could not be loaded, so the playground cannot run.\n${e?.message ?? e}\n`
      + 'Build it with `make playground` (or scripts/build-js.sh) and serve www/ over http://127.0.0.1.');
    $('build-info').textContent = 'WebAssembly failed to load';
    document.body.dataset.state = 'error';
    return;
  }
  controls.forEach((c) => { c.disabled = false; });
  $('store-select').querySelector('option[value=worker]').disabled = true;

  const settings = loadSettings();
  const save = () => {
    localStorage.setItem(SETTINGS_KEY, JSON.stringify({
      store: $('store-select').value,
      editor: $('envelope-editor').value,
      ttl: $('ttl-ms').value,
      claiming: $('claiming').checked,
      lease: $('lease-ms').value,
    }));
  };

  // ---- editor and live validation ---------------------------------------------
  const editor = $('envelope-editor');
  editor.value = settings.editor ?? JSON.stringify(DEFAULT_ENVELOPE, null, 2);
  $('ttl-ms').value = settings.ttl ?? '';
  $('claiming').checked = Boolean(settings.claiming);
  if (settings.lease) $('lease-ms').value = settings.lease;

  function options() {
    const o = {};
    const ttl = $('ttl-ms').value.trim();
    if (ttl !== '' && Number(ttl) >= 0) o.ttlMs = Number(ttl);
    const lease = Number($('lease-ms').value || 30000);
    if ($('claiming').checked) o.claimLeaseMs = lease >= 0 ? lease : 30000;
    return o;
  }

  function renderValidation() {
    const box = $('validation');
    const v = bq.validate(editor.value);
    box.replaceChildren();
    if (!v.valid) {
      box.className = 'validation bad';
      box.dataset.state = 'rejected';
      box.append(el('strong', {}, 'Rejected (poison): '), el('code', {}, v.rejection.code),
        el('div', {}, v.rejection.message));
      return;
    }
    const rows = [['job', v.job], ['trace_id', v.traceId], ['attempts', String(v.attempts)]];
    if (v.failOpen) {
      box.className = 'validation open';
      box.dataset.state = 'fail-open';
      box.append(el('strong', {}, 'Valid, but no usable meta.id: fail-open. '),
        'Every delivery runs the handler and nothing is remembered (absent, null, empty or non-string ids).');
      rows.unshift(['dedupe key', '(none)']);
    } else {
      box.className = 'validation ok';
      box.dataset.state = 'valid';
      box.append(el('strong', {}, 'Valid envelope.'));
      rows.unshift(['dedupe key', JSON.stringify(v.key)]);
    }
    const dl = el('dl');
    for (const [k, val] of rows) dl.append(el('dt', {}, k), el('dd', { class: k === 'dedupe key' ? 'key' : '' }, val));
    box.append(dl);
  }
  let timer;
  editor.addEventListener('input', () => {
    clearTimeout(timer);
    timer = setTimeout(() => { renderValidation(); save(); }, 60);
  });
  renderValidation();

  // ---- fixtures -----------------------------------------------------------------
  const fixtureCache = new Map();
  const fixtureText = async (path) => {
    if (!fixtureCache.has(path)) {
      fixtureCache.set(path, fetch(`conformance/${path}`).then((r) => {
        if (!r.ok) throw new Error(`conformance/${path}: HTTP ${r.status}`);
        return r.text();
      }));
    }
    return fixtureCache.get(path);
  };
  let manifestPromise = null;
  const manifestText = () => {
    manifestPromise ??= fetch('conformance/manifest.json').then((r) => {
      if (!r.ok) throw new Error(`conformance/manifest.json: HTTP ${r.status}`);
      return r.text();
    });
    return manifestPromise;
  };
  manifestText().then((text) => {
    const m = JSON.parse(text);
    const select = $('fixture-select');
    select.replaceChildren(...m.cases.map((c) => el('option', { value: c.file }, `${c.name}${c.valid ? '' : ' (invalid)'}`)));
  }).catch((e) => {
    $('fixture-select').replaceChildren(el('option', { value: '' }, 'fixtures unavailable'));
    console.warn(e);
  });
  $('load-fixture').addEventListener('click', async () => {
    const path = $('fixture-select').value;
    if (!path) return;
    editor.value = await fixtureText(path);
    renderValidation();
    save();
  });

  // ---- store sessions -------------------------------------------------------------
  let session = null;
  const timeline = [];
  let queue = Promise.resolve();
  let pending = 0; // busy until every queued job has finished, not just the first
  const enqueue = (fn) => {
    pending += 1;
    document.body.dataset.busy = 'true';
    queue = queue.then(fn).catch((e) => showError(`${e?.message ?? e}`)).finally(() => {
      pending -= 1;
      if (pending === 0) document.body.dataset.busy = 'false';
    });
    return queue;
  };

  function openSession(kind) {
    session?.dispose();
    if (kind === 'persistent') session = persistentStore();
    else if (kind === 'worker') session = workerStore();
    else session = memoryStore(bq);
    const notes = {
      memory: 'lives in this tab; gone on reload',
      persistent: 'localStorage: a reload keeps the seen-set',
      worker: 'the worker\u2019s Durable Object, over HTTP',
    };
    $('store-note').textContent = notes[session.kind];
    for (const id of ['advance-1s', 'advance-1m', 'advance-1h']) $(id).disabled = !session.canAdvance;
    renderClock();
  }

  function renderClock() {
    const s = Math.round(session.clockOffset() / 1000);
    $('clock').textContent = `+${s.toLocaleString()} s`;
  }

  const fmtEntry = (e) => {
    let text = `${JSON.stringify(e.key)} ${e.state}`;
    if (e.expiresAt !== null && e.expiresAt !== undefined) {
      const now = session.now();
      text += `, expires in ${Math.max(0, Math.ceil((e.expiresAt - now) / 1000))} s`;
    }
    return text;
  };

  async function snapshot() {
    try {
      return (await session.entries()).map(fmtEntry);
    } catch (e) {
      return [`(cannot list: ${e.message})`];
    }
  }

  async function renderStore(lines) {
    const list = lines ?? await snapshot();
    $('store-contents').replaceChildren(...(list.length ? list.map((l) => el('li', {}, l)) : [el('li', { class: 'note' }, '(empty)')]));
  }

  function renderTimeline() {
    const body = $('timeline').querySelector('tbody');
    body.replaceChildren(...timeline.map((row) => {
      const expect = row.expect && row.expect !== row.effect
        ? el('div', { class: 'expect-miss' }, `expected ${row.expect}`) : null;
      return el('tr', { dataset: { decision: row.decision, kind: row.kind ?? '', action: row.action } },
        el('td', {}, String(row.n)),
        el('td', {}, row.action),
        el('td', { class: 'id' }, shownId(row)),
        el('td', {}, row.handler ?? ''),
        el('td', {}, el('span', { class: `badge ${row.decision}` }, row.decision), expect),
        el('td', {}, row.kind ?? '', row.reason ? el('div', { class: 'note' }, row.reason) : null),
        el('td', { class: 'snapshot' }, row.snapshot.length ? row.snapshot.join('; ') : '(empty)'));
    }));
    $('timeline-empty').hidden = timeline.length > 0;
  }

  async function push(row) {
    row.n = timeline.length + 1;
    row.snapshot = await snapshot();
    timeline.push(row);
    renderTimeline();
    await renderStore(row.snapshot);
  }

  /**
   * An id as the timeline shows it: plain when it reads as itself, else its JSON
   * string (a blank, padded or control-character id); a long one is cut.
   */
  function shownId(row) {
    if (row.metaId === null || row.metaId === undefined || row.metaId === '') return row.id ?? '';
    const id = row.metaId;
    const plain = id.trim() === id && !/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(id);
    const shown = plain ? id : JSON.stringify(id);
    return shown.length > 80 ? `${shown.slice(0, 60)}\u2026 (${id.length} characters)` : shown;
  }

  function rowOf(outcome, v, throws, expect, action = 'deliver') {
    return {
      action,
      id: v.valid ? (v.id === null ? '(no id)' : v.id) : '(invalid)',
      metaId: v.valid ? (v.id ?? '') : null,
      handler: outcome.ran ? (throws ? 'throws' : 'ok') : 'not run',
      threw: throws,
      decision: decisionOf(outcome.kind),
      kind: outcome.kind,
      effect: outcome.ran ? 'run' : outcome.kind,
      expect,
      reason: outcome.kind === 'skip' && throws ? 'the handler (set to throw) was not run'
        : outcome.kind === 'run-ok' || outcome.kind === 'skip' ? null : (outcome.rejection?.message ?? outcome.reason ?? null),
    };
  }

  async function deliver(body, throws, expect) {
    const v = bq.validate(body);
    const handlerError = new Error('handler throws (toggled in the playground)');
    const outcome = await bq.dedupe(body, session.store, () => {
      if (throws) throw handlerError;
    }, options());
    await push(rowOf(outcome, v, throws, expect));
    return outcome;
  }

  /** Two consumers receive the same delivery at once; each handler takes 300 ms. */
  async function deliverConcurrently(body) {
    const v = bq.validate(body);
    const slow = () => new Promise((resolve) => { setTimeout(resolve, 300); });
    const opts = options();
    const outcomes = await Promise.all([0, 1].map(() => bq.dedupe(body, session.store, slow, opts)));
    for (const outcome of outcomes) await push(rowOf(outcome, v, false, undefined, 'deliver (concurrent)'));
  }

  /**
   * Consumer A's claim is lost while its handler runs: with a clock to move, A
   * stalls past its lease and consumer B takes the id and runs it; otherwise the
   * id is forgotten mid-run. A lease-capable store reports run-ok-lease-lost for A.
   */
  async function deliverLeaseLost(body) {
    const v = bq.validate(body);
    const opts = { ...options(), claimLeaseMs: Number($('lease-ms').value) || 30000 };
    let taken = null;
    const outcome = await bq.dedupe(body, session.store, async () => {
      if (session.canAdvance && v.valid && v.id !== null) {
        session.advance(opts.claimLeaseMs + 1000);
        renderClock();
        taken = await bq.dedupe(body, session.store, () => {}, opts);
      } else if (v.valid && v.id !== null) {
        await bq.forget(v.id, session.store, options());
      }
    }, opts);
    if (taken) await push(rowOf(taken, v, false, undefined, 'deliver (consumer B, after A\u2019s lease ran out)'));
    await push(rowOf(outcome, v, false, undefined, taken ? 'deliver (consumer A, stalled)' : 'deliver (forgotten mid-run)'));
  }

  const editorId = () => {
    const v = bq.validate(editor.value);
    return v.valid ? v.id : null;
  };

  async function forgetId(id) {
    await bq.forget(id, session.store);
    await push({ action: 'forget', id, decision: 'forget', kind: null, metaId: id });
  }

  $('deliver').addEventListener('click', () => enqueue(() => deliver(editor.value, false)));
  $('deliver-throw').addEventListener('click', () => enqueue(() => deliver(editor.value, true)));
  $('deliver-twice').addEventListener('click', () => enqueue(() => deliverConcurrently(editor.value)));
  $('deliver-lease-lost').addEventListener('click', () => enqueue(() => deliverLeaseLost(editor.value)));
  $('deliver-fixture').addEventListener('click', () => enqueue(async () => {
    const path = $('fixture-select').value;
    if (path) await deliver(await fixtureText(path), false);
  }));
  $('forget').addEventListener('click', () => enqueue(async () => {
    const id = $('forget-id').value || editorId();
    if (id) await forgetId(id);
    else showError('Nothing to forget: type an id, or put an envelope with a meta.id in the editor.');
  }));
  for (const id of ['advance-1s', 'advance-1m', 'advance-1h']) {
    $(id).addEventListener('click', (ev) => enqueue(async () => {
      const ms = Number(ev.target.dataset.ms);
      session.advance(ms);
      renderClock();
      await push({ action: `clock ${ev.target.textContent}`, decision: 'clock', kind: null });
    }));
  }
  $('reset').addEventListener('click', () => enqueue(async () => {
    session.clear?.();
    openSession($('store-select').value);
    timeline.length = 0;
    renderTimeline();
    await renderStore();
  }));
  $('store-select').addEventListener('change', () => enqueue(async () => {
    openSession($('store-select').value);
    timeline.length = 0;
    renderTimeline();
    await renderStore();
    save();
  }));
  for (const id of ['ttl-ms', 'claiming', 'lease-ms']) $(id).addEventListener('change', save);

  // ---- sequences: export / import / replay -----------------------------------------
  function exportSequence() {
    const deliveries = [];
    let pendingForget = new Set();
    const notes = [];
    // The ids this timeline's exported rows record: a replay on a fresh store
    // skips those and runs the rest, so a row that went otherwise (an id the
    // store held before the timeline, a TTL run out) cannot be replayed.
    const recorded = new Set();
    for (const row of timeline) {
      if (row.action === 'forget') { pendingForget.add(row.id); recorded.delete(row.id); continue; }
      if (row.action !== 'deliver') { notes.push(`row ${row.n} (${row.action}) is not expressible and was left out`); continue; }
      if (row.metaId === null) { notes.push(`delivery ${row.n} (invalid envelope) was left out`); continue; }
      const replayed = row.metaId !== '' && recorded.has(row.metaId) ? 'skip' : 'run';
      if (row.effect !== replayed) {
        notes.push(`delivery ${row.n} (${row.effect}) follows the store's state from before this timeline or a clock move, and was left out`);
        continue;
      }
      if (row.effect === 'run' && !row.threw && row.metaId !== '') recorded.add(row.metaId);
      const d = { meta_id: row.metaId, expect_effect: row.effect };
      if (pendingForget.has(row.metaId)) { d.forget_before = true; pendingForget.delete(row.metaId); }
      if (row.effect === 'run') d.outcome = row.threw ? 'throw' : 'ok';
      // Keep the manifest's key order: meta_id, forget_before, expect_effect, outcome.
      deliveries.push(Object.fromEntries(['meta_id', 'forget_before', 'expect_effect', 'outcome']
        .filter((k) => k in d).map((k) => [k, d[k]])));
    }
    const sequence = {
      name: 'playground-sequence',
      description: `Built in the bq-dedupe playground (${new Date().toISOString()}).`,
      deliveries,
      expected_effects: deliveries.filter((d) => d.expect_effect === 'run').length,
    };
    const text = JSON.stringify(sequence, null, 2);
    $('sequence-json').value = text;
    const link = $('sequence-download');
    URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(new Blob([text + '\n'], { type: 'application/json' }));
    $('sequence-details').open = true;
    $('sequence-note').textContent = notes.length ? `Exported; ${notes.join('; ')}.` : '';
    return sequence;
  }

  let imported = [];
  function importSequences(text) {
    let data;
    try { data = JSON.parse(text); } catch (e) { throw new Error(`Not JSON: ${e.message}`); }
    const cases = data?.deliveries ? [data]
      : Array.isArray(data?.cases) && data.cases.every((c) => c.deliveries) ? data.cases
        : data?.idempotency?.sequences?.cases ?? data?.sequences?.cases;
    if (!Array.isArray(cases) || !cases.length) {
      throw new Error('Expected a sequence ({deliveries: [...]}), a sequences block ({cases: [...]}) or a manifest.');
    }
    for (const c of cases) {
      if (!Array.isArray(c.deliveries) || !c.deliveries.every((d) => typeof d.meta_id === 'string')) {
        throw new Error(`Sequence ${JSON.stringify(c.name ?? '?')}: every delivery needs a string meta_id.`);
      }
    }
    imported = cases;
    const select = $('sequence-select');
    select.replaceChildren(...cases.map((c, i) => el('option', { value: String(i) }, c.name ?? `sequence ${i + 1}`)));
    select.hidden = false;
    $('replay-sequence').hidden = false;
    $('sequence-json').value = JSON.stringify(cases.length === 1 ? cases[0] : { cases }, null, 2);
  }

  async function replay(seq) {
    let template;
    try {
      template = JSON.parse(editor.value);
      if (typeof template !== 'object' || template === null || !bq.validate(template).valid) throw new Error();
    } catch {
      template = structuredClone(DEFAULT_ENVELOPE);
    }
    template.meta ??= {};
    session.clear?.();
    openSession($('store-select').value);
    timeline.length = 0;
    renderTimeline();
    for (const d of seq.deliveries) {
      if (d.forget_before) await forgetId(d.meta_id);
      template.meta.id = d.meta_id;
      await deliver(JSON.stringify(template), d.outcome === 'throw', d.expect_effect);
    }
    const runs = timeline.filter((r) => r.effect === 'run').length;
    const misses = timeline.filter((r) => r.expect && r.expect !== r.effect).length;
    const ok = misses === 0 && (seq.expected_effects === undefined || runs === seq.expected_effects);
    $('store-note').textContent = `replayed ${JSON.stringify(seq.name ?? 'sequence')}: ${ok ? 'as expected' : 'differs from its expectations'} (${runs} effects${seq.expected_effects === undefined ? '' : `, expected ${seq.expected_effects}`})`;
  }

  $('export-sequence').addEventListener('click', () => exportSequence());
  $('import-sequence').addEventListener('click', () => $('import-file').click());
  $('import-file').addEventListener('change', async (ev) => {
    const file = ev.target.files?.[0];
    if (!file) return;
    try { importSequences(await file.text()); } catch (e) { showError(e.message); }
    ev.target.value = '';
  });
  $('sequence-from-text').addEventListener('click', () => {
    try { importSequences($('sequence-json').value); } catch (e) { showError(e.message); }
  });
  $('replay-sequence').addEventListener('click', () => enqueue(async () => {
    const seq = imported[Number($('sequence-select').value) || 0];
    if (seq) await replay(seq);
  }));

  // ---- conformance -------------------------------------------------------------------
  $('run-conformance').addEventListener('click', async () => {
    const button = $('run-conformance');
    button.disabled = true;
    $('conformance-summary').textContent = 'running…';
    try {
      const text = await manifestText();
      const body = $('conformance-table').querySelector('tbody');
      body.replaceChildren();
      const report = await conformance.runConformance(bq, text, fixtureText, {}, (r) => {
        body.append(el('tr', { dataset: { passed: String(r.passed) } },
          el('td', {}, r.name),
          el('td', {}, el('span', { class: `badge ${r.passed ? 'pass' : 'fail'}` }, r.passed ? 'pass' : 'FAIL')),
          el('td', {}, r.failure ?? '')));
      });
      $('conformance-table').hidden = false;
      $('conformance-summary').textContent = report.summary;
    } catch (e) {
      $('conformance-summary').textContent = 'could not run';
      showError(`Conformance: ${e.message}`);
    } finally {
      button.disabled = false;
    }
  });

  // ---- start -----------------------------------------------------------------------
  const storeSelect = $('store-select');
  const worker = await workerAvailable();
  storeSelect.querySelector('option[value=worker]').disabled = !worker;
  if (!worker) storeSelect.querySelector('option[value=worker]').textContent = 'worker (only when served by the fixture worker)';
  storeSelect.value = settings.store === 'worker' && !worker ? 'memory' : (settings.store ?? 'memory');
  openSession(storeSelect.value);
  renderTimeline();
  await renderStore();
  $('build-info').textContent = 'WebAssembly loaded: bq-dedupe core (wasm-bindgen web build).';
  document.body.dataset.state = 'ready';
}

main().catch((e) => showError(`The playground failed to start: ${e?.message ?? e}`));
