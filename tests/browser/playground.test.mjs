// The playground (www/) end to end in headless Chromium: Debian's /usr/bin/chromium
// driven by playwright-core, the page served by scripts/serve-www.mjs on a free
// 127.0.0.1 port. Screenshots of each state go to tests/browser/artifacts/
// (git-ignored). Needs `scripts/build-js.sh` first (make browser-test does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serveWww } from '../../scripts/serve-www.mjs';
import { launchChromium } from './chromium.mjs';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const ARTIFACTS = here('./artifacts/');
mkdirSync(ARTIFACTS, { recursive: true });

// The manifest's full count, computed here independently of the page and the package.
const manifest = JSON.parse(readFileSync(here('../conformance/manifest.json'), 'utf8'));
const FULL_COUNT = manifest.cases.length + 1 + manifest.idempotency.sequences.cases.length;

let server;
let chromium;
let browser;

before(async () => {
  assert.ok(existsSync(here('../../www/pkg/bq_dedupe_bg.wasm')), 'www/pkg is missing: run scripts/build-js.sh');
  server = await serveWww({ port: 0 });
  chromium = await launchChromium();
  browser = chromium.context;
});

after(async () => {
  await chromium?.close();
  await server?.close();
});

/** A fresh page on the playground with empty localStorage, loaded and ready. */
async function openPlayground({ clear = true, viewport } = {}) {
  const page = await browser.newPage();
  if (viewport) await page.setViewportSize(viewport);
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  await page.goto(server.url);
  if (clear) {
    await page.evaluate(() => localStorage.clear());
    await page.reload();
  }
  await page.waitForSelector('body[data-state=ready]');
  page.errors = errors;
  page.consoleErrors = consoleErrors;
  return page;
}

const idle = (page) => page.waitForFunction(() => document.body.dataset.busy !== 'true');

async function rows(page) {
  await idle(page);
  return page.$$eval('#timeline tbody tr', (trs) => trs.map((tr) => ({
    decision: tr.dataset.decision,
    kind: tr.dataset.kind,
    id: tr.children[2].textContent,
    store: tr.children[6].textContent,
  })));
}

async function setEditor(page, value) {
  const text = typeof value === 'string' ? value : JSON.stringify(value, null, 2);
  await page.fill('#envelope-editor', text);
  // Until the 60 ms debounce has validated and saved it: a fixed 150 ms lost to a loaded machine.
  await page.waitForFunction(
    (t) => JSON.parse(localStorage.getItem('bq-dedupe-playground:settings') ?? '{}').editor === t,
    text, { timeout: 20_000 });
}

/** Waits for #validation to show `state` (and `text`): a loaded machine renders late. On a
 * timeout the assertions after it say what it shows. */
async function validation(page, state, text) {
  await page.waitForFunction(([s, t]) => {
    const box = document.querySelector('#validation');
    return box.dataset.state === s && (!t || box.textContent.includes(t));
  }, [state, text], { timeout: 20_000 }).catch(() => {});
}

const envelope = (id) => ({
  job: 'urn:babel:orders:created', trace_id: 't-1', data: { n: 1 }, meta: { id, schema_version: 1 }, attempts: 0,
});

test('the page loads the wasm and validates the editor live: derived key, fail-open, rejection reason', async () => {
  const page = await openPlayground();
  assert.equal(await page.getAttribute('#validation', 'data-state'), 'valid');
  assert.match(await page.textContent('#validation'), /dedupe key\s*"order-1042"/);
  assert.equal(await page.isVisible('#error-banner'), false);
  assert.deepEqual(page.consoleErrors, [], 'the page loads with no console error (the worker probe too)');
  assert.equal(await page.$eval('#store-select option[value=worker]', (o) => o.disabled), true,
    'the worker store is offered only when the page is served by the fixture worker');
  await page.screenshot({ path: join(ARTIFACTS, '01-loaded.png'), fullPage: true });

  await setEditor(page, envelope(''));
  await validation(page, 'fail-open');
  assert.equal(await page.getAttribute('#validation', 'data-state'), 'fail-open');
  assert.match(await page.textContent('#validation'), /fail-open/);
  await page.screenshot({ path: join(ARTIFACTS, '02-fail-open.png'), fullPage: true });

  await setEditor(page, { ...envelope('x'), meta: { id: 'x', schema_version: 2 } });
  await validation(page, 'rejected', 'unsupported-schema-version');
  assert.equal(await page.getAttribute('#validation', 'data-state'), 'rejected');
  assert.match(await page.textContent('#validation'), /unsupported-schema-version/);
  await setEditor(page, '{"job": ');
  await validation(page, 'rejected', 'not-json');
  assert.match(await page.textContent('#validation'), /not-json/);
  await page.screenshot({ path: join(ARTIFACTS, '03-rejected.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test(`"Run conformance" shows "${FULL_COUNT} passed, 0 failed", the manifest's full count, and a row per result`, async () => {
  const page = await openPlayground();
  await page.getByRole('button', { name: 'Run conformance', exact: true }).click();
  const summary = page.locator('#conformance-summary');
  await summary.filter({ hasText: /^\d+ passed, \d+ failed$/ }).waitFor();
  assert.equal(await summary.textContent(), `${FULL_COUNT} passed, 0 failed`);
  const results = await page.$$eval('#conformance-table tbody tr', (trs) => trs.map((tr) => tr.dataset.passed));
  assert.equal(results.length, FULL_COUNT);
  assert.ok(results.every((p) => p === 'true'));
  await page.screenshot({ path: join(ARTIFACTS, '04-conformance.png'), fullPage: true });
  await page.close();
});

test('deliver, deliver, throw-deliver, deliver, forget, deliver: run, skip, skip, skip, forget, run; a throwing first run leaves the id unmarked', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope('id-A'));
  await page.click('#deliver');
  await page.click('#deliver');
  await page.click('#deliver-throw');
  await page.click('#deliver');
  await page.click('#forget');
  await page.click('#deliver');
  let got = await rows(page);
  assert.deepEqual(got.map((r) => r.decision), ['run', 'skip', 'skip', 'skip', 'forget', 'run']);
  assert.deepEqual(got.map((r) => r.kind), ['run-ok', 'skip', 'skip', 'skip', '', 'run-ok']);
  assert.ok(got.every((r) => r.id === 'id-A'));
  assert.match(got[0].store, /"id-A" done/);
  assert.equal(got[4].store, '(empty)', 'the store is empty right after the forget');
  await page.screenshot({ path: join(ARTIFACTS, '05-timeline.png'), fullPage: true });

  // A new id whose first delivery throws: it ran (run-failed), was not remembered, so it runs again.
  await setEditor(page, envelope('id-B'));
  await page.click('#deliver-throw');
  await page.click('#deliver');
  await page.click('#deliver');
  got = (await rows(page)).slice(6);
  assert.deepEqual(got.map((r) => [r.decision, r.kind]), [['run', 'run-failed'], ['run', 'run-ok'], ['skip', 'skip']]);
  assert.doesNotMatch(got[0].store, /id-B/);

  // Export in the conformance `sequences` format.
  await page.click('#export-sequence');
  const exported = JSON.parse(await page.inputValue('#sequence-json'));
  assert.deepEqual(exported.deliveries.slice(0, 6), [
    { meta_id: 'id-A', expect_effect: 'run', outcome: 'ok' },
    { meta_id: 'id-A', expect_effect: 'skip' },
    { meta_id: 'id-A', expect_effect: 'skip' },
    { meta_id: 'id-A', expect_effect: 'skip' },
    { meta_id: 'id-A', forget_before: true, expect_effect: 'run', outcome: 'ok' },
    { meta_id: 'id-B', expect_effect: 'run', outcome: 'throw' },
  ]);
  assert.equal(exported.expected_effects, 4);
  await page.screenshot({ path: join(ARTIFACTS, '06-export.png'), fullPage: true });
  await page.close();
});

test('fail-open and rejected deliveries show as such in the timeline, never touching the store', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope(null));
  await page.click('#deliver');
  await page.click('#deliver');
  await setEditor(page, '[1, 2]');
  await page.click('#deliver');
  await page.selectOption('#fixture-select', 'fixtures/invalid-missing-urn.json');
  await page.click('#deliver-fixture');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => r.decision), ['fail-open', 'fail-open', 'rejected', 'rejected']);
  assert.ok(got.every((r) => r.store === '(empty)'));
  await page.screenshot({ path: join(ARTIFACTS, '07-fail-open-rejected.png'), fullPage: true });
  await page.close();
});

test('with a TTL, advancing the simulated clock past it lets the id run again', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope('ttl-1'));
  await page.fill('#ttl-ms', '60000');
  await page.click('#deliver');
  await page.click('#deliver');
  await page.click('#advance-1m');
  await page.click('#deliver');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => r.decision), ['run', 'skip', 'clock', 'run']);
  assert.match(got[0].store, /expires in 60 s/);
  await page.close();
});

test('claiming mode parks nothing for sequential deliveries and shows claims released after a throw', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope('claim-1'));
  await page.check('#claiming');
  await page.click('#deliver-throw');
  await page.click('#deliver');
  await page.click('#deliver');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => r.kind), ['run-failed', 'run-ok', 'skip']);
  assert.equal(got[0].store, '(empty)', 'the failed run released its claim');
  await page.close();
});

test('two concurrent deliveries of one id both run without claiming; with claiming one runs and the other parks', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope('race-1'));
  await page.click('#deliver-twice');
  let got = await rows(page);
  assert.deepEqual(got.map((r) => r.kind), ['run-ok', 'run-ok'], 'post-success dedupe alone runs both');
  await setEditor(page, envelope('race-2'));
  await page.check('#claiming');
  await page.click('#deliver-twice');
  got = (await rows(page)).slice(2);
  assert.deepEqual(got.map((r) => r.decision).sort(), ['park', 'run']);
  await page.screenshot({ path: join(ARTIFACTS, '07b-claiming-park.png'), fullPage: true });
  await page.close();
});

test('a claim lost while the handler runs shows run-ok-lease-lost: another consumer took the id after the lease ran out (memory and persistent stores)', async () => {
  const page = await openPlayground();
  for (const store of ['memory', 'persistent']) {
    await page.selectOption('#store-select', store);
    await idle(page);
    await setEditor(page, envelope(`lost-${store}`));
    await page.click('#deliver-lease-lost');
    const got = await rows(page);
    assert.deepEqual(got.map((r) => [r.decision, r.kind]), [['run', 'run-ok'], ['run', 'run-ok-lease-lost']], store);
    await page.click('#deliver');
    assert.equal((await rows(page))[2].kind, 'skip', `${store}: the id is remembered`);
  }
  assert.match(await page.textContent('.lede'), /run-ok-lease-lost/, 'the legend names the new kind');
  await page.screenshot({ path: join(ARTIFACTS, '07c-lease-lost.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('with the persistent store a delivered id is skipped after a page reload', async () => {
  const page = await openPlayground();
  await page.selectOption('#store-select', 'persistent');
  await idle(page);
  await setEditor(page, envelope('persist-1'));
  await page.click('#deliver');
  assert.deepEqual((await rows(page)).map((r) => r.decision), ['run']);
  await page.screenshot({ path: join(ARTIFACTS, '08-persistent-before-reload.png'), fullPage: true });

  await page.reload();
  await page.waitForSelector('body[data-state=ready]');
  assert.equal(await page.inputValue('#store-select'), 'persistent');
  assert.match(await page.textContent('#store-contents'), /"persist-1" done/);
  await page.click('#deliver');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => [r.decision, r.id]), [['skip', 'persist-1']]);
  await page.screenshot({ path: join(ARTIFACTS, '09-persistent-after-reload.png'), fullPage: true });
  await page.close();
});

test('an export after a reload leaves out what a fresh store cannot replay (an id remembered before the timeline, a clock move), says so beside the sequence, and replays as expected', async () => {
  const page = await openPlayground();
  await page.selectOption('#store-select', 'persistent');
  await idle(page);
  await setEditor(page, envelope('before-reload'));
  await page.click('#deliver');
  await page.reload();
  await page.waitForSelector('body[data-state=ready]');
  await page.fill('#ttl-ms', '5000');
  await page.click('#deliver'); // skip: remembered before this timeline began
  await setEditor(page, envelope('fresh'));
  await page.click('#deliver');
  await page.click('#deliver-throw'); // skip: the handler, set to throw, is not run
  await page.click('#advance-1m');
  await page.click('#deliver'); // run again: its TTL ran out
  await page.click('#deliver');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => r.decision), ['skip', 'run', 'skip', 'clock', 'run', 'skip']);
  const throwRow = await page.$eval('#timeline tbody tr:nth-child(3)', (tr) => tr.children[5].textContent);
  assert.match(throwRow, /not run/, 'a skip says the throwing handler was not run');

  await page.click('#export-sequence');
  const exported = JSON.parse(await page.inputValue('#sequence-json'));
  assert.deepEqual(exported.deliveries, [
    { meta_id: 'fresh', expect_effect: 'run', outcome: 'ok' },
    { meta_id: 'fresh', expect_effect: 'skip' },
    { meta_id: 'fresh', expect_effect: 'skip' },
  ]);
  assert.equal(exported.expected_effects, 1);
  assert.equal(await page.isVisible('#error-banner'), false, 'an export that leaves rows out is not an error');
  assert.match(await page.textContent('#sequence-note'), /delivery 1 .*left out/);
  assert.match(await page.textContent('#sequence-note'), /delivery 5 .*left out/);

  await page.click('#sequence-from-text');
  await page.selectOption('#store-select', 'memory');
  await idle(page);
  await page.click('#replay-sequence');
  await idle(page);
  assert.match(await page.textContent('#store-note'), /as expected \(1 effects, expected 1\)/);
  await page.close();
});

test('an id shows as its JSON string when blank or padded, and a long one is cut', async () => {
  const page = await openPlayground();
  await setEditor(page, envelope(' '));
  await page.click('#deliver');
  await setEditor(page, envelope('x'.repeat(5000)));
  await page.click('#deliver');
  const got = await rows(page);
  assert.equal(got[0].id, '" "');
  assert.ok(got[1].id.length < 200, `a 5000-character id is cut (${got[1].id.length})`);
  assert.match(got[1].id, /5000 characters/);
  await page.close();
});

test('importing the manifest\'s sequences and replaying each matches every expect_effect', async () => {
  const page = await openPlayground();
  await page.click('#sequence-details summary');
  await page.fill('#sequence-json', JSON.stringify(manifest));
  await page.click('#sequence-from-text');
  const names = await page.$$eval('#sequence-select option', (os) => os.map((o) => o.textContent));
  assert.deepEqual(names, manifest.idempotency.sequences.cases.map((c) => c.name));
  for (const [i, seq] of manifest.idempotency.sequences.cases.entries()) {
    await page.selectOption('#sequence-select', String(i));
    await page.click('#replay-sequence');
    const got = await rows(page);
    const expected = seq.deliveries.flatMap((d) => [...(d.forget_before ? ['forget'] : []), d.expect_effect === 'run'
      ? (d.meta_id === '' ? 'fail-open' : 'run') : d.expect_effect]);
    assert.deepEqual(got.map((r) => r.decision), expected, seq.name);
    assert.equal(await page.$$eval('.expect-miss', (e) => e.length), 0, seq.name);
    assert.match(await page.textContent('#store-note'), /as expected/);
  }
  await page.screenshot({ path: join(ARTIFACTS, '10-replayed.png'), fullPage: true });
  await page.close();
});

test('served by the worker (GET stats answers JSON), the worker store is offered and used through its HTTP API', async () => {
  // A stand-in for the fixture worker's Durable Object endpoints, same origin.
  const done = new Map();
  const claims = new Map();
  const requests = [];
  const page = await browser.newPage();
  await page.route('**/*', async (route) => {
    const req = route.request();
    const path = new URL(req.url()).pathname;
    const json = (body) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(body) });
    if (path === '/stats') return json({ runs: 0 });
    if (!path.startsWith('/store/')) return route.continue();
    const body = req.method() === 'POST' ? JSON.parse(req.postData()) : null;
    requests.push([req.method(), path, body]);
    switch (path) {
      case '/store/seen': return json({ seen: body.keys.map((k) => done.has(k)) });
      case '/store/remember': body.keys.forEach((k) => { done.set(k, body.ttl_ms); claims.delete(k); }); return json({ ok: true });
      case '/store/claim': return json({ claims: body.keys.map((k) => {
        if (done.has(k)) return { state: 'seen' };
        if (claims.has(k)) return { state: 'held' };
        claims.set(k, `tok-${k}`);
        return { state: 'acquired', token: `tok-${k}` };
      }) });
      case '/store/release': body.releases.forEach(({ key, token }) => { if (claims.get(key) === token) claims.delete(key); }); return json({ ok: true });
      case '/store/forget': body.keys.forEach((k) => { done.delete(k); claims.delete(k); }); return json({ forgotten: body.keys.length });
      case '/store/entries': return json({ entries: [...done.keys()].map((key) => ({ key, state: 'done', expires_at: null })) });
      default: return route.fulfill({ status: 404, body: 'not found' });
    }
  });
  await page.goto(server.url);
  await page.evaluate(() => localStorage.clear());
  await page.reload();
  await page.waitForSelector('body[data-state=ready]');
  assert.equal(await page.$eval('#store-select option[value=worker]', (o) => o.disabled), false);
  await page.selectOption('#store-select', 'worker');
  await idle(page);
  await setEditor(page, envelope('w-1'));
  await page.click('#deliver');
  await page.click('#deliver');
  await page.click('#forget');
  await page.check('#claiming');
  await page.click('#deliver-throw');
  await page.click('#deliver');
  const got = await rows(page);
  assert.deepEqual(got.map((r) => r.kind), ['run-ok', 'skip', '', 'run-failed', 'run-ok']);
  assert.match(got[0].store, /"w-1" done/);
  const posts = requests.filter(([m]) => m === 'POST').map(([, path, body]) => [path, body]);
  assert.deepEqual(posts.slice(0, 5), [
    ['/store/seen', { keys: ['w-1'] }],
    ['/store/remember', { keys: ['w-1'], ttl_ms: null }],
    ['/store/seen', { keys: ['w-1'] }],
    ['/store/forget', { keys: ['w-1'] }],
    ['/store/claim', { keys: ['w-1'], lease_ms: 30000 }],
  ]);
  assert.deepEqual(posts.slice(5), [
    ['/store/release', { releases: [{ key: 'w-1', token: 'tok-w-1' }] }],
    ['/store/claim', { keys: ['w-1'], lease_ms: 30000 }],
    ['/store/remember', { keys: ['w-1'], ttl_ms: null }],
  ]);
  await page.screenshot({ path: join(ARTIFACTS, '10b-worker-store.png'), fullPage: true });
  await page.close();
});

test('the error banner (not a blank page) appears when the wasm fails to load', async () => {
  const page = await browser.newPage();
  await page.route('**/*.wasm', (route) => route.fulfill({ status: 404, contentType: 'text/plain', body: 'not found' }));
  await page.goto(server.url);
  await page.waitForSelector('#error-banner:not([hidden])');
  assert.match(await page.textContent('#error-banner'), /WebAssembly module could not be loaded/);
  assert.equal(await page.getAttribute('body', 'data-state'), 'error');
  assert.equal(await page.isDisabled('#deliver'), true);
  await page.screenshot({ path: join(ARTIFACTS, '11-wasm-failed.png'), fullPage: true });
  await page.close();
});

test('at phone width the page has no horizontal overflow and keeps every control reachable', async () => {
  const page = await openPlayground({ viewport: { width: 390, height: 844 } });
  await setEditor(page, envelope('phone-1'));
  await page.click('#deliver');
  await page.click('#deliver');
  await idle(page);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `page overflows by ${overflow}px`);
  for (const id of ['#deliver', '#deliver-throw', '#forget', '#run-conformance', '#store-select']) {
    assert.ok(await page.isVisible(id), id);
  }
  await page.screenshot({ path: join(ARTIFACTS, '12-phone.png'), fullPage: true });
  await page.close();
});
