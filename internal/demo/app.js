// Sandstorm demo server for Node.js: the protocol of app.py, built-in
// modules only.
//
// GET /         -> 200 "count=N pid=P\n"; N increments on every request, so
//                  a client can prove that memory survived pause or
//                  checkpoint/restore.
// GET /healthz  -> 200 "ok".
// anything else -> 404 "not found\n" (405 for a method other than GET/HEAD).
//
// Listens on 0.0.0.0:8000; the PORT environment variable overrides the port.
'use strict';

const http = require('http');

// One thread runs every handler (Node's event loop), so the counter needs
// no lock however many connections are open.
let count = 0;

function reply(req, res, code, body, headers) {
  const data = Buffer.from(body);
  res.writeHead(code, Object.assign({
    'Content-Type': 'text/plain; charset=utf-8',
    'Content-Length': data.length,
  }, headers));
  // A HEAD reply carries the GET reply's headers but no body.
  res.end(req.method === 'HEAD' ? undefined : data);
}

const server = http.createServer((req, res) => {
  // Drain any request body so the connection can carry the next request.
  req.resume();
  const path = req.url.split('?', 1)[0];
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    reply(req, res, 405, 'method not allowed\n', { Allow: 'GET, HEAD' });
  } else if (path === '/healthz') {
    reply(req, res, 200, 'ok');
  } else if (path === '/') {
    // HEAD only looks: it must not move the counter a GET reports.
    const n = req.method === 'GET' ? ++count : count;
    reply(req, res, 200, `count=${n} pid=${process.pid}\n`);
  } else {
    reply(req, res, 404, 'not found\n');
  }
});

// Node's default keepAliveTimeout is 5 s: it would close idle keep-alive
// connections long before clients do (Go's http.Transport keeps them 90 s,
// IdleConnTimeout), and a request sent as the server closes fails on the
// client. 120 s leaves closing to the client; nothing else limits idle
// connections (server.timeout is 0, none, since Node 13).
server.keepAliveTimeout = 120 * 1000;

// A malformed request or a peer reset costs one connection, never the
// process: with no 'clientError' listener, Node's server answers what it
// can (400, or 408/431 for a slow or oversized head) and destroys just that
// socket. Node 20's headersTimeout (60 s) and requestTimeout (300 s)
// likewise bound a client that stalls mid-request.

// As PID 1 in a sandbox a signal without a handler is ignored, so SIGTERM
// would not stop the server unless handled.
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => process.exit(0));
}

const port = parseInt(process.env.PORT || '8000', 10);
// backlog 511 is Node's default, written out: a burst of connects waits in
// the kernel's accept queue instead of being refused.
server.listen({ host: '0.0.0.0', port, backlog: 511 }, () => {
  console.log(`listening on 0.0.0.0:${port} pid=${process.pid}`);
});
