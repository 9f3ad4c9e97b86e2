// A read-only npm registry on 127.0.0.1 serving the given package tarballs, for installing coda-shim's
// packages offline exactly as from the real registry (npm resolves the optional platform packages by name
// and picks them by os/cpu from their metadata). Used by scripts/npm-check.
//
//   node scripts/npm-registry.mjs PORT_FILE TARBALL...
//
// Listens on a free port, writes `http://127.0.0.1:<port>/` to PORT_FILE, serves until killed. Answers
// GET /<name> (scoped names as npm sends them, `@scope%2fname`) with the package's metadata document and
// GET /-/<file>.tgz with the tarball; anything else is 404. Each request is logged on stderr.
import { createServer } from 'node:http';
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, renameSync } from 'node:fs';
import { basename } from 'node:path';

const [portFile, ...tarballs] = process.argv.slice(2);
if (!portFile || tarballs.length === 0) {
  process.stderr.write('usage: node scripts/npm-registry.mjs PORT_FILE TARBALL...\n');
  process.exit(2);
}

const files = new Map();
const packages = new Map();
for (const tarball of tarballs) {
  const bytes = readFileSync(tarball);
  const manifest = JSON.parse(execFileSync('tar', ['-xzOf', tarball, 'package/package.json'], { encoding: 'utf8' }));
  const file = basename(tarball);
  files.set(file, bytes);
  const doc = packages.get(manifest.name) ?? { name: manifest.name, 'dist-tags': {}, versions: {} };
  doc.versions[manifest.version] = {
    ...manifest,
    _id: `${manifest.name}@${manifest.version}`,
    dist: {
      tarball: `/-/${file}`,
      shasum: createHash('sha1').update(bytes).digest('hex'),
      integrity: `sha512-${createHash('sha512').update(bytes).digest('base64')}`,
    },
  };
  doc['dist-tags'].latest = manifest.version;
  packages.set(manifest.name, doc);
}

const server = createServer((req, res) => {
  const url = new URL(req.url, 'http://127.0.0.1');
  const origin = `http://127.0.0.1:${server.address().port}`;
  let status = 404;
  let body = JSON.stringify({ error: 'not found' });
  let type = 'application/json';
  if (req.method === 'GET' && url.pathname.startsWith('/-/') && files.has(url.pathname.slice(3))) {
    status = 200;
    body = files.get(url.pathname.slice(3));
    type = 'application/octet-stream';
  } else if (req.method === 'GET') {
    const doc = packages.get(decodeURIComponent(url.pathname.slice(1)));
    if (doc) {
      status = 200;
      const versions = Object.fromEntries(
        Object.entries(doc.versions).map(([v, m]) => [v, { ...m, dist: { ...m.dist, tarball: origin + m.dist.tarball } }]),
      );
      body = JSON.stringify({ ...doc, versions });
    }
  }
  process.stderr.write(`npm-registry: ${req.method} ${url.pathname} ${status}\n`);
  res.writeHead(status, { 'content-type': type });
  res.end(body);
});

server.listen(0, '127.0.0.1', () => {
  writeFileSync(`${portFile}.tmp`, `http://127.0.0.1:${server.address().port}/\n`);
  renameSync(`${portFile}.tmp`, portFile);
});
