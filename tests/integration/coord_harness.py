"""Helpers for the tessera-coordinator integration tests (not a test itself).

- Cluster: S tessera-shard processes on ephemeral loopback ports plus one
  tessera-coordinator in front of them (config written into a mktemp dir), with
  start/stop/kill of the coordinator for crash tests;
- write_batch(): a batch_root of JSON-lines files (and delete/ files);
- update(): UpdateIndex + GetOperation polling until the operation ends.
Everything lives under one mktemp dir removed at exit; nothing is written to the tree.
"""
import json
import os
import signal
import subprocess
import tempfile
import time

import shard_harness as sh

BIN = sh.BIN


def stubs():
    """(tessera_pb2, tessera_pb2_grpc, shard_pb2, shard_pb2_grpc)"""
    shard_pb2, shard_pb2_grpc, tessera_pb2, _, _ = sh.stubs()
    from tessera.v1 import tessera_pb2_grpc
    return tessera_pb2, tessera_pb2_grpc, shard_pb2, shard_pb2_grpc


free_port = sh.free_port  # (tests call ch.free_port)


def batch_allow_args(*extra):
    """--batch-root-allow flags for a test coordinator: the system temp folder, where every
    test writes its batches (sh.tmpdir), and any extra folder. tests/integration/
    test_batch_confine.py tests the confinement itself."""
    args = []
    for d in (tempfile.gettempdir(),) + extra:
        args += ["--batch-root-allow", d]
    return args


# A coordinator process; its log is collected, its port read from the log.
Proc = sh.LoggedProc


class Api:
    """UpdateIndex / GetOperation / GetIndexStats over self.stub (a VectorSearchStub); shared
    by Cluster here and by the multi-host cluster (multihost/mh.py)."""

    def update(self, batch_root, overwrite=False, max_invalid=0, timeout=180, md=None):
        """md: call metadata, e.g. [("authorization", "Bearer " + token)]."""
        tp = stubs()[0]
        r = self.stub.UpdateIndex(tp.UpdateIndexRequest(batch_root=batch_root,
                                                        is_complete_overwrite=overwrite,
                                                        max_invalid_records=max_invalid),
                                  timeout=30, metadata=md)
        return self.wait_op(r.operation_id, timeout, md)

    def fold(self, timeout=180, md=None):
        """UpdateIndex with fold_stream: the streamed writes folded into a new version."""
        tp = stubs()[0]
        r = self.stub.UpdateIndex(tp.UpdateIndexRequest(fold_stream=True), timeout=30,
                                  metadata=md)
        return self.wait_op(r.operation_id, timeout, md)

    def wait_op(self, op_id, timeout=180, md=None):
        tp = stubs()[0]
        t0 = time.time()
        done = (tp.Operation.SUCCEEDED, tp.Operation.REJECTED, tp.Operation.FAILED)
        while True:
            op = self.stub.GetOperation(tp.GetOperationRequest(operation_id=op_id), timeout=10,
                                        metadata=md)
            if op.state in done:
                return op
            if time.time() - t0 > timeout:
                raise AssertionError("operation %s not done after %ds: %s" % (op_id, timeout, op))
            time.sleep(0.05)

    def stats(self):
        tp = stubs()[0]
        return self.stub.GetIndexStats(tp.GetIndexStatsRequest(), timeout=10)


class Cluster(Api):
    def __init__(self, nshards=4, dims=32, config=None, template=None, env=None, bin_dir=None,
                 root=None, shard_extra=(), coord_extra=(), as_built=False):
        """as_built: run bin_dir's binaries even when env sets a test knob (sh.test_argv)."""
        self.root = root or sh.tmpdir("tsr-coord-")
        self.bin = bin_dir or BIN
        self.as_built = as_built
        self.shards = []
        for i in range(nshards):
            self.shards.append(sh.Shard(os.path.join(self.root, "shard-%d" % i),
                                        extra=shard_extra, bin_dir=self.bin,
                                        as_built=as_built))
        cfg = {"dimensions": dims, "shards": [s.target for s in self.shards]}
        if "san-" in os.path.basename(os.path.dirname(os.path.abspath(self.bin))):
            # ASan+UBSan binaries run 3-5x slower (more on a loaded CI machine): give the
            # shard fan-out room unless the test sets its own deadline.
            cfg["search_deadline_ms"] = 20000
        cfg.update(config or {})
        self.config = os.path.join(self.root, "coordinator.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.template = template
        self.coord = None
        self.start(env, extra_args=coord_extra)

    def start(self, env=None, listen_port=0, extra_args=()):
        """listen_port 0: a free_port() (sh.start_listening: so that a restart on self.port
        finds it free)."""
        argv = [os.path.join(self.bin, "tessera-coordinator"), "--data",
                os.path.join(self.root, "coordinator"), "--config", self.config]
        if self.template:
            argv += ["--template", self.template]
        argv += batch_allow_args(self.root)
        argv += list(extra_args)
        self.coord = sh.start_listening(
            lambda p: Proc(argv + ["--listen", "127.0.0.1:%d" % p], env, self.as_built),
            listen_port,
            "coordinator")
        import grpc
        self.target = "127.0.0.1:%d" % self.coord.port
        self.channel = grpc.insecure_channel(self.target)
        tp, tpg, _, _ = stubs()
        self.stub = tpg.VectorSearchStub(self.channel)
        return self.coord

    def stop_coord(self, sig=signal.SIGTERM, timeout=30):
        try:
            self.channel.close()
        except Exception:
            pass
        p = self.coord.proc
        if p.poll() is None:
            p.send_signal(sig)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("coordinator did not stop within %ds:\n%s" %
                                 (timeout, self.coord.text()))
        self.coord.thread.join(5)
        text = self.coord.text()
        if sig != signal.SIGKILL and rc != 137:
            assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text \
                and "LeakSanitizer" not in text, "sanitizer report:\n" + text
            assert rc == 0, "coordinator exit code %s:\n%s" % (rc, text)
        return rc

    def wait_exit(self, timeout=120):
        rc = self.coord.proc.wait(timeout)
        self.coord.thread.join(5)
        return rc

    def stop(self):
        """Stops everything, also when one stop fails its checks (a sanitizer report, an
        exit code): the first failure is raised after every process was stopped."""
        errors = []
        try:
            if self.coord and self.coord.proc.poll() is None:
                self.stop_coord()
        except BaseException as e:
            errors.append(e)
        for s in self.shards:
            try:
                s.stop()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]



def dp_json(did, vec=None, sparse=None, restricts=None, numeric=None, tag=None):
    o = {"id": did}
    if vec is not None:
        o["embedding"] = [float(v) for v in vec]
    if sparse is not None:
        o["sparse_embedding"] = {"values": [float(v) for v in sparse[1]],
                                 "dimensions": [int(d) for d in sparse[0]]}
    if restricts:
        o["restricts"] = [{"namespace": ns, "allow": list(a), "deny": list(d)}
                          for ns, a, d in restricts]
    if numeric:
        o["numeric_restricts"] = [{"namespace": ns, "value_" + kind: val}
                                  for ns, kind, val in numeric]
    if tag is not None:
        o["crowding_tag"] = tag
    return o


def write_batch(root, records, deletes=(), per_file=50000):
    """records: list of dicts (dp_json); deletes: ids. Returns root."""
    os.makedirs(root, exist_ok=True)
    for k in range(0, max(len(records), 1), per_file):
        part = records[k:k + per_file]
        if not part:
            break
        with open(os.path.join(root, "part-%05d.json" % (k // per_file)), "w") as f:
            for r in part:
                f.write(json.dumps(r, separators=(",", ":")))
                f.write("\n")
    if deletes:
        os.makedirs(os.path.join(root, "delete"), exist_ok=True)
        with open(os.path.join(root, "delete", "ids.txt"), "w") as f:
            for d in deletes:
                f.write(d + "\n")
    return root


def query(tp, vec=None, k=10, sparse=None, crowding=0, cand=None, fraction=0.0, restricts=None,
          numeric=None, alpha=None, allow_partial=False, qid=""):
    """One FindNeighbors query. cand: approximate_neighbor_count; None leaves it unset (the
    index setting: exact re-rank by default), 0 sets it to 0 (PQ distances)."""
    dp = tp.IndexDatapoint(datapoint_id=qid)
    if vec is not None:
        dp.feature_vector.extend([float(v) for v in vec])
    if sparse is not None:
        dp.sparse_embedding.dimensions.extend(sparse[0])
        dp.sparse_embedding.values.extend(sparse[1])
    for ns, a, d in restricts or []:
        dp.restricts.add(namespace=ns, allow_list=a, deny_list=d)
    for ns, kind, val, op in numeric or []:
        n = dp.numeric_restricts.add(namespace=ns, op=op)
        setattr(n, "value_" + kind, val)
    q = tp.FindNeighborsRequest.Query(datapoint=dp, neighbor_count=k,
                                      per_crowding_attribute_neighbor_count=crowding,
                                      fraction_leaf_nodes_to_search_override=fraction,
                                      allow_partial=allow_partial)
    if cand is not None:
        q.approximate_neighbor_count = cand  # a oneof member: 0 is sent too
    if alpha is not None:
        q.rrf.alpha = alpha
    return q
