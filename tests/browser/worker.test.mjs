// The playground served by the real fixture worker (workerd through Miniflare,
// wrangler.toml's [assets]), using the worker's own Durable Object store: what the
// page remembers, the queue consumer skips, and the reverse. Needs the worker built
// (scripts/build-worker.sh; make browser-test does it).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TOKEN, envelope, startWorker } from '../../crates/workers/tests/harness.mjs';
import { launchChromium } from './chromium.mjs';

const ARTIFACTS = fileURLToPath(new URL('./artifacts/', import.meta.url));
mkdirSync(ARTIFACTS, { recursive: true });

let worker;
let chromium;

before(async () => {
  worker = await startWorker({ assets: true });
  chromium = await launchChromium();
});

after(async () => {
  await chromium?.close();
  await worker?.dispose();
});

const idle = (page) => page.waitForFunction(() => document.body.dataset.busy !== 'true');

async function decisions(page) {
  await idle(page);
  return page.$$eval('#timeline tbody tr', (trs) => trs.map((tr) => tr.dataset.kind));
}

test('served by the fixture worker, the playground shares its Durable Object store with the queue consumer', async () => {
  const url = await worker.mf.ready;
  const page = await chromium.context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // The worker's routes need its admin token: the page asks for it once.
  const asked = [];
  page.on('dialog', async (dialog) => {
    asked.push(dialog.message());
    await dialog.accept(TOKEN);
  });
  await page.goto(url.href);
  await page.waitForSelector('body[data-state=ready]');
  assert.equal(await page.$eval('#store-select option[value=worker]', (o) => o.disabled), false,
    'the worker store is offered when the page is served by the worker (found without the token)');
  assert.equal(asked.length, 0, 'no token asked for before the worker store is chosen');
  await page.selectOption('#store-select', 'worker');
  await idle(page);
  assert.equal(asked.length, 1, 'the token is asked for when the worker store is chosen');
  assert.match(asked[0], /EXAMPLE_ADMIN_TOKEN/);

  // Delivered in the browser: remembered in the worker's store, so the queue skips it.
  await page.fill('#envelope-editor', JSON.stringify(envelope('pw-page'), null, 2));
  await page.waitForTimeout(150);
  await page.click('#deliver');
  await page.click('#deliver');
  assert.deepEqual(await decisions(page), ['run-ok', 'skip']);
  assert.deepEqual((await worker.seen(['pw-page'])).seen, [true]);
  const stats = await worker.publishAndWait([envelope('pw-page')]);
  assert.equal(stats.skips, 1, 'the consumer skipped what the page remembered');

  // Consumed from the queue: the page sees it as already processed.
  await worker.publishAndWait([envelope('pw-queue')]);
  await page.fill('#envelope-editor', JSON.stringify(envelope('pw-queue'), null, 2));
  await page.waitForTimeout(150);
  await page.click('#deliver');
  assert.deepEqual((await decisions(page)).at(-1), 'skip');

  // Forgotten from the page: gone from the worker's store.
  await page.click('#forget');
  await idle(page);
  assert.deepEqual((await worker.seen(['pw-queue'])).seen, [false]);
  await page.screenshot({ path: join(ARTIFACTS, '20-served-by-worker.png'), fullPage: true });
  assert.equal(asked.length, 1, 'asked once per tab');
  assert.deepEqual(errors, []);
});

test('after a wrong token (refused with 401) the worker store asks again, and works with the right one', async () => {
  const url = await worker.mf.ready;
  const page = await chromium.context.newPage();
  const answers = ['not-the-token', TOKEN];
  const asked = [];
  page.on('dialog', async (dialog) => {
    asked.push(dialog.message());
    await dialog.accept(answers.shift() ?? TOKEN);
  });
  await page.goto(url.href);
  await page.waitForSelector('body[data-state=ready]');
  await page.selectOption('#store-select', 'worker');
  await idle(page);
  await page.fill('#envelope-editor', JSON.stringify(envelope('pw-wrong-token'), null, 2));
  await page.waitForTimeout(150);
  // The store view's first request was refused: the token is asked for again.
  await page.click('#deliver');
  assert.deepEqual(await decisions(page), ['run-ok']);
  assert.equal(asked.length, 2, 'asked again after the refusal');
  assert.deepEqual(answers, [], 'both answers used');
  assert.deepEqual((await worker.seen(['pw-wrong-token'])).seen, [true]);
  await page.close();
});
