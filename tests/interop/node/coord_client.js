// node @grpc/grpc-js client for tessera-coordinator (tessera.v1.VectorSearch), driven by
// tests/integration/test_coord_node.py.
// usage: node coord_client.js TARGET PLAN.json
// PLAN.json: {"batch_root": DIR, "queries": [FindNeighborsRequest.Query...],
//             "return_full_datapoint": bool, "read_ids": [ids], "bad_dims": N}
// Loads the project's protos with @grpc/proto-loader and calls, in order: UpdateIndex
// (batch_root), GetOperation until the operation ends, FindNeighbors (the queries),
// ReadIndexDatapoints (read_ids), GetIndexStats, a FindNeighbors with a wrong dimension
// and GetOperation of an unknown id. Prints one JSON object with what it got: datapoints
// in a canonical form (canon() below, the python driver builds the same one).
'use strict';
const path = require('path');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const root = path.resolve(__dirname, '..', '..', '..', 'proto');
const opts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
               includeDirs: [root] };
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(['tessera/v1/tessera.proto'], opts));

const [target, planFile] = process.argv.slice(2);
const plan = JSON.parse(fs.readFileSync(planFile, 'utf8'));
const vs = new pkg.tessera.v1.VectorSearch(target, grpc.credentials.createInsecure());
const call = (m, req, ms = 30000) => new Promise((resolve) => {
  vs[m](req, { deadline: new Date(Date.now() + ms) }, (err, resp) => resolve({ err, resp }));
});
const must = async (m, req) => {
  const r = await call(m, req);
  if (r.err) throw new Error(`${m}: ${r.err.code} ${r.err.details}`);
  return r.resp;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Datapoint → [id, dense, restricts, numeric, crowding tag, sparse dims, sparse values]
function canon(dp) {
  if (!dp) return null;
  const numeric = (dp.numeric_restricts || []).map((n) => {
    const kind = n.Value; // oneof discriminator: value_int | value_float | value_double
    return [n.namespace, kind || '', kind ? String(n[kind]) : ''];
  });
  return [dp.datapoint_id, dp.feature_vector || [],
          (dp.restricts || []).map((r) => [r.namespace, r.allow_list, r.deny_list]), numeric,
          dp.crowding_tag ? dp.crowding_tag.crowding_attribute : '',
          dp.sparse_embedding ? dp.sparse_embedding.dimensions.map(String) : [],
          dp.sparse_embedding ? dp.sparse_embedding.values : []];
}

(async () => {
  const out = {};
  const up = await must('UpdateIndex', { batch_root: plan.batch_root });
  out.operation_id = up.operation_id;
  let op;
  const t0 = Date.now();
  const states = new Set();
  for (;;) {
    op = await must('GetOperation', { operation_id: up.operation_id });
    states.add(op.state);
    if (['SUCCEEDED', 'REJECTED', 'FAILED'].includes(op.state)) break;
    if (Date.now() - t0 > 120000) throw new Error('operation not done after 120 s');
    await sleep(50);
  }
  out.operation = { state: op.state, version: Number(op.version), error: op.error,
                    valid_records: Number(op.report ? op.report.valid_records : -1),
                    shards_total: op.progress ? op.progress.shards_total : -1,
                    shards_committed: op.progress ? op.progress.shards_committed : -1,
                    states_seen: [...states] };
  const fn = await must('FindNeighbors', { queries: plan.queries,
                                           return_full_datapoint: !!plan.return_full_datapoint });
  out.version = Number(fn.version);
  out.neighbors = fn.nearest_neighbors.map((nn) => ({
    id: nn.id,
    neighbors: nn.neighbors.map((n) => ({ id: n.datapoint.datapoint_id, distance: n.distance,
                                          sparse_distance: n.sparse_distance,
                                          datapoint: canon(n.datapoint) })),
  }));
  const rd = await must('ReadIndexDatapoints', { ids: plan.read_ids });
  out.read = rd.datapoints.map(canon);
  const st = await must('GetIndexStats', {});
  out.stats = { vectors_count: Number(st.vectors_count), version: Number(st.version),
                shards_count: st.shards_count };
  const q0 = JSON.parse(JSON.stringify(plan.queries[0]));
  q0.datapoint.feature_vector = new Array(plan.bad_dims).fill(0.5);
  const bad = await call('FindNeighbors', { queries: [q0] });
  out.bad = bad.err ? { code: bad.err.code, details: bad.err.details } : null;
  const unk = await call('GetOperation', { operation_id: 'no-such-operation' });
  out.unknown_op = unk.err ? unk.err.code : null;
  vs.close();
  process.stdout.write(JSON.stringify(out) + '\n');
})().catch((e) => { console.error('node coord client failed:', e); process.exit(1); });
