// node @grpc/grpc-js client over several coordinators, driven by tests/interop/
// test_ha_clients.py. usage: node ha_client.js SNIPPET.js ADDRS PLAN.json
// SNIPPET.js: the node snippet of docs/ha.md (exports coordinatorClient); ADDRS: comma
// list of coordinators; PLAN.json: {"queries": [FindNeighborsRequest.Query...],
// "seconds": S, "batch_root": DIR (optional: an UpdateIndex through the same client)}.
// Sends one query at a time for S seconds (round-robin over ADDRS by the snippet's
// client), then the UpdateIndex if asked, and prints one JSON object: answered, failed,
// the first errors, the neighbors of each query (first answer), the update's response.
'use strict';
const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [snippet, addrs, planFile] = process.argv.slice(2);
const { coordinatorClient } = require(path.resolve(snippet));
const root = path.resolve(__dirname, '..', '..', '..', 'proto');
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(['tessera/v1/tessera.proto'],
  { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
    includeDirs: [root] }));
const plan = JSON.parse(fs.readFileSync(planFile, 'utf8'));
const vs = coordinatorClient(pkg.tessera.v1.VectorSearch, addrs.split(','));
const call = (m, req, ms = 5000) => new Promise((resolve) => {
  vs[m](req, { deadline: new Date(Date.now() + ms) }, (err, resp) => resolve({ err, resp }));
});

(async () => {
  const out = { answered: 0, failed: 0, errors: [], first: {} };
  const t_end = Date.now() + plan.seconds * 1000;
  let i = 0;
  while (Date.now() < t_end) {
    const q = i++ % plan.queries.length;
    const r = await call('FindNeighbors', { queries: [plan.queries[q]] });
    if (r.err) {
      out.failed++;
      if (out.errors.length < 5) out.errors.push(`${r.err.code} ${r.err.details}`);
    } else {
      out.answered++;
      if (!(q in out.first)) {
        out.first[q] = r.resp.nearest_neighbors[0].neighbors.map((n) => n.datapoint.datapoint_id);
      }
    }
  }
  if (plan.batch_root) {
    const r = await call('UpdateIndex', { batch_root: plan.batch_root }, 30000);
    out.update = r.err ? { code: r.err.code, details: r.err.details } : r.resp;
  }
  console.log(JSON.stringify(out));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
