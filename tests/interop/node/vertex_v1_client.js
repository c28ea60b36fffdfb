// Google's official node client for Vertex AI (@google-cloud/aiplatform, pinned in
// package-lock.json), used unmodified against tessera-coordinator's
// google.cloud.aiplatform.v1.MatchService; driven by tests/interop/test_vertex_v1_node.py.
// usage: node vertex_v1_client.js PORT CALLS.json [TOKEN]
// CALLS.json: [{"method": "findNeighbors" | "readIndexDatapoints" | ..., "request": {...},
// "client": "MatchServiceClient" (default) | "IndexServiceClient", "lro": true}] (the
// client's own request objects: camelCase field names). With "lro" the call returns a
// long-running operation (updateIndex) and its operation.promise() is awaited: the result
// is what the promise resolves to (or its rejection's code and details). With TOKEN every call sends
// `authorization: Bearer TOKEN` through the client's call options (otherArgs.headers).
// Prints one JSON object: per call either {"response": <the response object>} or
// {"code", "details"}.
'use strict';
const fs = require('fs');
const { v1 } = require('@google-cloud/aiplatform');
const { grpc } = require('google-gax'); // the grpc-js the client itself uses

const [port, cfile, token] = process.argv.slice(2);
const calls = JSON.parse(fs.readFileSync(cfile, 'utf8'));
const clients = {};
const client = (name) => {
  // exactly what a user writes to point the official client at another endpoint
  if (!clients[name])
    clients[name] = new v1[name]({ apiEndpoint: '127.0.0.1', port: Number(port),
                                   sslCreds: grpc.credentials.createInsecure() });
  return clients[name];
};
const opts = { timeout: 30000 };
if (token)
  opts.otherArgs = { headers: { authorization: 'Bearer ' + token } };

(async () => {
  const out = { results: [] };
  for (const c of calls) {
    try {
      const [resp] = await client(c.client || 'MatchServiceClient')[c.method](c.request, opts);
      if (c.lro) {
        const [done] = await resp.promise(); // polls google.longrunning.Operations/GetOperation
        out.results.push({ response: done, operation: resp.name });
      } else {
        out.results.push({ response: resp });
      }
    } catch (e) {
      out.results.push({ code: e.code, details: e.details || e.message });
    }
  }
  for (const k of Object.keys(clients))
    await clients[k].close();
  // int64s decode as Long objects: print them as decimal strings
  const longs = (k, v) => (v && typeof v === 'object' && 'low' in v && 'high' in v &&
                           'unsigned' in v ? v.toString() : v);
  process.stdout.write(JSON.stringify(out, longs) + '\n');
})().catch((e) => { console.error('node client failed:', e); process.exit(1); });
