#!/usr/bin/env node
// A tiny static server for the playground: serves www/ on 127.0.0.1, `.wasm` as
// application/wasm, nothing cached. Used by `make playground` and the browser test.
//
//   node scripts/serve-www.mjs [PORT]     # PORT from argv, else $PORT, else 0 (any free port)
//
// Prints "serving http://127.0.0.1:PORT/" once listening. As a module:
// `const { url, close } = await serveWww({ port: 0 })`.
import { createServer } from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(fileURLToPath(new URL('../www/', import.meta.url)));

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.png': 'image/png',
  '.svg': 'image/svg+xml',
  '.ico': 'image/x-icon',
  '.ts': 'text/plain; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
};

export function serveWww({ port = 0, root = ROOT, host = '127.0.0.1' } = {}) {
  const server = createServer(async (req, res) => {
    const send = (status, body, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'method not allowed');
    let path;
    try {
      path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    } catch {
      return send(400, 'bad path');
    }
    // The page probes `stats` for the fixture worker; "no worker" here, without
    // the 404 a browser logs as a console error on every load.
    if (path === '/stats') return send(204, '');
    const file = normalize(join(root, path.endsWith('/') ? path + 'index.html' : path));
    if (file !== root && !file.startsWith(root + sep)) return send(403, 'forbidden');
    try {
      const info = await stat(file);
      if (info.isDirectory()) {
        // Relative to this directory's own name, so a path like `//host/..` can
        // never become a redirect to another host.
        res.writeHead(301, { location: `./${path.split('/').pop()}/` });
        return res.end();
      }
      const body = await readFile(file);
      return send(200, req.method === 'HEAD' ? '' : body, TYPES[extname(file)] ?? 'application/octet-stream');
    } catch {
      return send(404, 'not found');
    }
  });
  return new Promise((resolveServer, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      const { port: bound } = server.address();
      resolveServer({
        url: `http://${host}:${bound}/`,
        port: bound,
        close: () => new Promise((done) => { server.closeAllConnections?.(); server.close(() => done()); }),
      });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const port = Number(process.argv[2] ?? process.env.PORT ?? 0);
  const { url } = await serveWww({ port });
  console.log(`serving ${url}`);
}
