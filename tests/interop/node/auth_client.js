// node @grpc/grpc-js client for the authorization matrix of tests/integration/test_auth.py.
// usage: node auth_client.js PLAN.json
// PLAN: {"target": "127.0.0.1:P", "ca": null | "ca.pem", "name": "localhost",
//        "tokens": {"none": null, "admin": "..."},
//        "calls": [{"service": "tessera.v1.VectorSearch", "method": "FindNeighbors",
//                   "request": {...proto field names...}}  or  {..., "raw": base64 bytes}]}
// Every call is made once per token. Plaintext: the token travels as per-call metadata
// "authorization: Bearer <token>". TLS ("ca" set): as call credentials composed with the
// channel's SSL credentials (the way a grpc-js user attaches a bearer token). Prints one
// JSON object: {"results": {"<token>": {"<service>/<method>": {code, details}}}}.
'use strict';
const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const repo = path.resolve(__dirname, '..', '..', '..');
const opts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
               includeDirs: [path.join(repo, 'tests', 'integration', 'vertex_client_proto'),
                             path.join(repo, 'proto')] };
const def = protoLoader.loadSync(['tessera/v1/tessera.proto', 'match_service.proto',
                                  'google/cloud/aiplatform/v1/match_service.proto',
                                  'grpc/health/v1/health.proto'], opts);
const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function client(token) {
  const chopts = { 'grpc.ssl_target_name_override': plan.name || 'localhost',
                   'grpc.default_authority': plan.name || 'localhost' };
  if (!plan.ca)
    return new grpc.Client(plan.target, grpc.credentials.createInsecure());
  let creds = grpc.credentials.createSsl(fs.readFileSync(plan.ca));
  if (token) {
    const callCreds = grpc.credentials.createFromMetadataGenerator((params, cb) => {
      const md = new grpc.Metadata();
      md.add('authorization', 'Bearer ' + token);
      cb(null, md);
    });
    creds = grpc.credentials.combineChannelCredentials(creds, callCreds);
  }
  return new grpc.Client(plan.target, creds, chopts);
}

// A call given as raw wire bytes ("raw": base64): services whose protos keep only messages.
const identity = (x) => x;
function rawMethod(svc, method) {
  return { path: '/' + svc + '/' + method, requestSerialize: identity,
           responseDeserialize: identity };
}

function call(c, token, svc, method, req, raw) {
  const m = raw ? rawMethod(svc, method) : def[svc][method];
  if (raw)
    req = Buffer.from(raw, 'base64');
  const md = new grpc.Metadata();
  if (token && !plan.ca)
    md.add('authorization', 'Bearer ' + token);
  return new Promise((resolve) => {
    c.makeUnaryRequest(m.path, m.requestSerialize, m.responseDeserialize, req, md,
                       { deadline: new Date(Date.now() + 30000) }, (err) => {
      resolve(err ? { code: err.code, details: err.details } : { code: 0, details: '' });
    });
  });
}

(async () => {
  const out = { results: {} };
  for (const [name, token] of Object.entries(plan.tokens)) {
    const c = client(token);
    out.results[name] = {};
    for (const k of plan.calls)
      out.results[name][k.service + '/' + k.method] =
          await call(c, token, k.service, k.method, k.request, k.raw);
    c.close();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
})().catch((e) => { console.error('node client failed:', e); process.exit(1); });
