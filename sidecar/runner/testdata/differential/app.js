// The differential harness's Node.js upstream: Node's http module, routed
// the way a plain Node application routes, on the WHATWG URL of req.url.
// It records what it parsed of every request and serves the records at
// GET /seen?from=N on a second, control port. It prints "<port> <control
// port>" once both listen.
'use strict';
const http = require('http');
const seen = [];
let n = 0;

function route(method, path) {
  if (path === '/_end') return 'end';
  if (path === '/once') return method === 'GET' || method === 'HEAD' ? 'once' : '';
  if (path === '/login') return method === 'POST' ? 'login' : '';
  if (path === '/admin') return 'admin';
  if (path === '/keyed') return 'keyed';
  if (path.startsWith('/deep/')) return 'deep';
  return 'other';
}

const app = http.createServer((req, res) => {
  const id = 'node-' + (++n);
  let path = null;
  try {
    path = new URL(req.url, 'http://upstream').pathname;
  } catch (e) {
    path = null;
  }
  const handler = path === null ? '' : route(req.method, path);
  const key = req.headers['x-api-key'];
  seen.push({id: id, handler: handler, method: req.method, path: path === null ? req.url : path,
    key: key === undefined ? '' : key, hasKey: key !== undefined && key !== ''});
  req.resume();
  req.on('end', () => {
    res.statusCode = handler === '' ? 405 : 200;
    res.setHeader('x-diff-id', id);
    res.end(handler + '\n');
  });
});
app.keepAliveTimeout = 120000;

const control = http.createServer((req, res) => {
  const from = Number(new URL(req.url, 'http://control').searchParams.get('from') || 0);
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(seen.slice(from)));
});

app.listen(0, '127.0.0.1', () => {
  control.listen(0, '127.0.0.1', () => {
    console.log(app.address().port + ' ' + control.address().port);
  });
});
