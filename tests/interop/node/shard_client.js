// node @grpc/grpc-js client for tessera-shard, driven by tests/interop/test_shard_node.py.
// usage: node shard_client.js TARGET QUERIES.json
// Loads the project's protos with @grpc/proto-loader, calls grpc.health.v1.Health/Check,
// tessera.v1.Shard/Search with the queries of the JSON file, Stats, and a bad Search
// (k = 0), and prints one JSON object with what it got.
'use strict';
const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const root = path.resolve(__dirname, '..', '..', '..', 'proto');
const opts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
               includeDirs: [root] };
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(
  ['tessera/v1/shard.proto', 'grpc/health/v1/health.proto'], opts));

const [target, qfile] = process.argv.slice(2);
const queries = JSON.parse(fs.readFileSync(qfile, 'utf8'));
const creds = grpc.credentials.createInsecure();
const shard = new pkg.tessera.v1.Shard(target, creds);
const health = new pkg.grpc.health.v1.Health(target, creds);
const deadline = () => new Date(Date.now() + 10000);
const call = (client, m, req) => new Promise((resolve) => {
  client[m](req, { deadline: deadline() }, (err, resp) => resolve({ err, resp }));
});

(async () => {
  const out = {};
  const h = await call(health, 'Check', { service: '' });
  if (h.err) throw h.err;
  out.health = h.resp.status;
  const s = await call(shard, 'Search', { queries });
  if (s.err) throw s.err;
  out.results = s.resp.results.map((r) => ({ labels: r.labels.map(Number), distances: r.distances,
                                            ids: r.ids }));
  const st = await call(shard, 'Stats', {});
  if (st.err) throw st.err;
  out.current_version = Number(st.resp.current_version);
  const bad = await call(shard, 'Search', { queries: [Object.assign({}, queries[0], { k: 0 })] });
  out.bad = bad.err ? { code: bad.err.code, details: bad.err.details } : null;
  const un = await new Promise((resolve) => {
    const c = new grpc.Client(target, creds);
    c.makeUnaryRequest('/tessera.v1.Shard/NoSuchMethod', (x) => x, (x) => x, Buffer.alloc(0),
                       { deadline: deadline() }, (err) => { c.close(); resolve(err); });
  });
  out.unknown = un ? un.code : null;
  shard.close();
  health.close();
  process.stdout.write(JSON.stringify(out) + '\n');
})().catch((e) => { console.error('node client failed:', e); process.exit(1); });
