// node @grpc/grpc-js client for Vertex AI's MatchService as served by tessera-coordinator,
// driven by tests/interop/test_vertex_node.py.
// usage: node vertex_client.js TARGET REQUESTS.json
// Loads the CLIENT's hand-written copy of Vertex's match_service.proto
// (tests/integration/vertex_client_proto/, not the server's proto/ file) with
// @grpc/proto-loader, sends each MatchRequest of the JSON file (Vertex field names) to
// google.cloud.aiplatform.container.v1.MatchService/Match, and prints one JSON object:
// per request either the neighbors (id, distance, sparse_distance, crowding_attribute as
// a decimal string) and embeddings, or the error code and details.
'use strict';
const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const root = path.resolve(__dirname, '..', '..', 'integration', 'vertex_client_proto');
const opts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
               includeDirs: [root] };
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(['match_service.proto'], opts));

const [target, rfile] = process.argv.slice(2);
const requests = JSON.parse(fs.readFileSync(rfile, 'utf8'));
const creds = grpc.credentials.createInsecure();
const svc = new pkg.google.cloud.aiplatform.container.v1.MatchService(target, creds);
const call = (m, req) => new Promise((resolve) => {
  svc[m](req, { deadline: new Date(Date.now() + 30000) }, (err, resp) => resolve({ err, resp }));
});

(async () => {
  const out = { results: [] };
  for (const req of requests) {
    const r = await call('Match', req);
    if (r.err) {
      out.results.push({ code: r.err.code, details: r.err.details });
      continue;
    }
    out.results.push({
      neighbors: r.resp.neighbor.map((n) => ({ id: n.id, distance: n.distance,
                                               sparse_distance: n.sparse_distance,
                                               crowding_attribute: n.crowding_attribute })),
      embeddings: r.resp.embeddings.map((e) => ({ id: e.id, float_val: e.float_val,
                                                  crowding_attribute: e.crowding_attribute })),
    });
  }
  svc.close();
  process.stdout.write(JSON.stringify(out) + '\n');
})().catch((e) => { console.error('node client failed:', e); process.exit(1); });
