"""torch_ipc_workers.py - the trainer and the engine of torch_ipc_sync.py: its
two processes under the shim.

  trainer  torch_ipc_sync.py re-executed by the driver with --role trainer,
           which calls trainer_main here. It makes the weights in gmbd tag
           "train", runs the mode's rounds (run_sglang, run_vllm, run_kill)
           and writes its lines for the driver (ENGINE, HOLDING, TRAINER
           {json}) on its own descriptor.
  engine   the trainer's torch.multiprocessing spawn child. Its target,
           engine_main, is pickled by reference to this module: the child
           runs torch_ipc_sync.py again as __mp_main__ (which imports this
           module) and finds engine_main here by name, on the sys.path spawn
           hands it from the trainer (tests/gpu first).

What each mode sends, checks and reports is described in torch_ipc_sync.py.
"""

import gc
import json
import os
import pickle
import sys
import time
import traceback

from torch_ipc_common import (BUCKET_CAP, GiB, MiB, WAIT_S, Ctl, answer, ask, bucket_groups,
                              checksums, deserialize, engine_name, flatten, log, make_weights,
                              median, my_imports, serialize, spec_bytes, trainer_name,
                              weight_spec, words)

HERE = os.path.dirname(os.path.abspath(__file__))


# The engine (a spawned child of the trainer).

def engine_main(conn, mode, spec, driver_addr):
    """Serves the trainer over ``conn`` (and the driver over ``driver_addr`` in kill mode)."""
    os.dup2(2, 1)  # nothing of ours may reach the trainer's protocol pipe
    sys.stdout = sys.stderr
    try:
        if mode == "kill":
            engine_kill(conn, driver_addr)
        else:
            engine_sync(conn, mode, spec)
    except Exception as e:  # noqa: BLE001 - the trainer or the driver reports it
        traceback.print_exc()
        try:
            conn.send(("error", f"engine: {type(e).__name__}: {e}"))
        except OSError:
            pass


def engine_sync(conn, mode, spec):
    import torch

    import gmb
    from gmb.torch_memory_saver import torch_memory_saver as saver

    if not gmb.preload_active():
        raise RuntimeError("the engine is not under libgmb_preload.so")
    if os.environ.get("GMB_DEFAULT_TAG"):
        raise RuntimeError("the engine inherited GMB_DEFAULT_TAG")
    with saver.region(tag="weights"):
        weights = {name: torch.empty(shape, dtype=torch.bfloat16, device="cuda")
                   for name, shape in spec}
    torch.cuda.synchronize()
    client = gmb.default_client()
    conn.send(("ready", os.getpid(), client.id))
    load = {"bucket": load_bucket, "vllm": load_vllm}
    while True:
        msg = conn.recv()
        cmd = msg[0]
        if cmd == "quit":
            conn.send(("bye",))
            return
        if cmd == "sums":
            conn.send(("sums", checksums(list(weights.values()))))
            continue
        if cmd not in load:
            raise RuntimeError(f"unknown command {cmd!r}")
        # The received tensors live in load's frame only: gone when it returns.
        n, held = load[cmd](weights, client, msg[1], msg[2])
        # What both engines do after loading: let the imports go (the last
        # reference went with load's frame; no gc pass inside the timed sync).
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        conn.send(("ok", n, held))


def held_imports(client, **extra):
    """What gmbd lists as imported by this process, while it holds what it received."""
    mine, total = my_imports(client)
    return dict(imports=len(mine), bytes=sum(m["bytes"] for m in mine), imports_total=total,
                **extra)


def load_bucket(weights, client, data, check):
    """SGLang: update_weights_from_tensor(load_format="flattened_bucket")."""
    payload = deserialize(data)  # rebuild_cuda_tensor: the bucket's handle opened
    flat = payload["flattened_tensor"]
    held = held_imports(client, flat_bytes=flat.numel()) if check else None
    for m in payload["metadata"]:
        weights[m["name"]].copy_(flat[m["start"]:m["end"]].view(m["dtype"]).reshape(m["shape"]))
    return len(payload["metadata"]), held


def load_vllm(weights, client, data, check):
    """vLLM: IPCWeightTransferEngine.receive_weights, then load_weights."""
    import torch

    device = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    received, rewritten = [], 0
    for e in pickle.loads(data):
        func, args = e["ipc_handle"][uuid]
        args = list(args)
        if args[6] != device:
            rewritten += 1
        args[6] = device  # the sender's device index means nothing here
        w = func(*args)
        if w.dtype != e["dtype"] or tuple(w.shape) != tuple(e["shape"]):
            raise RuntimeError(f"{e['name']}: got {w.dtype} {tuple(w.shape)}")
        received.append((e["name"], w))
    held = held_imports(client, rewritten=rewritten) if check else None
    for name, w in received:
        weights[name].copy_(w)
    return len(received), held


def engine_kill(conn, driver_addr):
    import torch
    from multiprocessing.connection import Client

    import gmb
    from torch_common import bits_equal

    if not gmb.preload_active():
        raise RuntimeError("the engine is not under libgmb_preload.so")
    drv = Client(driver_addr, family="AF_UNIX")
    conn.send(("ready", os.getpid(), None))
    got = conn.recv()[1]  # ("tensors", [(name, tensor)]): torch.multiprocessing's reductions
    # The truth, in the runtime's memory (no region, no default tag here).
    refs = [t.clone() for _, t in got]
    sums0 = checksums([t for _, t in got])
    conn.send(("holding", os.getpid(), sums0))
    client = gmb.default_client()
    # From here on only the driver talks to us: the trainer gets killed.
    while True:
        cmd = drv.recv()
        if cmd == "check":
            torch.cuda.synchronize()
            equal = all(bits_equal(t, ref) for (_, t), ref in zip(got, refs))
            same = checksums([t for _, t in got]) == sums0
            mine, total = my_imports(client)
            drv.send({"equal": equal, "sums_same": same, "imports": len(mine),
                      "owner_freed": [m["owner_freed"] for m in mine]})
        elif cmd == "close":
            del got, refs
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.ipc_collect()
            end = time.monotonic() + 5
            mine, _ = my_imports(client)
            while mine and time.monotonic() < end:
                time.sleep(0.05)
                mine, _ = my_imports(client)
            drv.send({"closed": True, "imports_left": len(mine)})
            got, refs = [], []
        elif cmd == "quit":
            drv.send({"bye": True})
            drv.close()
            return
        else:
            drv.send({"error": f"unknown command {cmd!r}"})


# The trainer (a subprocess of the driver, under the shim).

class Trainer:
    def __init__(self, args, proto):
        import torch

        self.torch = torch
        self.args = args
        self.proto = proto
        self.failures = []
        self.ctl = Ctl(args.gmbctl)
        self.engine = None
        self.conn = None

    def say(self, kind, obj):
        """A line for the driver: KIND {json}."""
        self.proto.write(f"{kind} {json.dumps(obj)}\n")
        self.proto.flush()

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"[trainer] FAILED: {what}")
        return ok

    def spawn_engine(self, spec, driver_addr=None):
        """The engine as torch.multiprocessing starts children: spawned, the
        shim and the socket inherited; the trainer's own tag and name not."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        saved = {k: os.environ.get(k) for k in ("GMB_DEFAULT_TAG", "GMB_DEFAULT_MODE",
                                                 "GMB_CLIENT_NAME")}
        # libgmb and the shim read these once, at the first allocation, done by now.
        os.environ.pop("GMB_DEFAULT_TAG", None)
        os.environ.pop("GMB_DEFAULT_MODE", None)
        os.environ["GMB_CLIENT_NAME"] = engine_name(self.args.mode)
        try:
            # daemon: a trainer that exits early takes the engine with it.
            self.engine = ctx.Process(target=engine_main,
                                      args=(theirs, self.args.mode, spec, driver_addr),
                                      daemon=True)
            self.engine.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        theirs.close()
        self.conn = ours
        rep = answer(ours, 180)  # the child imports torch and makes a context
        self.say("ENGINE", {"pid": self.engine.pid})
        return rep

    def stop_engine(self):
        if self.engine is None:
            return
        try:
            if self.engine.is_alive():
                ask(self.conn, ("quit",), 60)
        except Exception as e:  # noqa: BLE001 - reported below
            self.expect(False, f"engine quit: {e}")
        self.engine.join(60)
        if self.engine.is_alive():
            self.engine.kill()
            self.engine.join(10)
            self.expect(False, "the engine did not exit")
        else:
            self.expect(self.engine.exitcode == 0, f"the engine exited {self.engine.exitcode}")

    def imports_of_mine(self, owner_id, deadline_s=5.0):
        """gmbd's open imports of this trainer's allocations, waited for to drop to
        none (under GMB_IPC_KEEP=1 a closed import stays listed, idle, until the
        trainer's pause asks for it back: it is closed, not open)."""
        end = time.monotonic() + deadline_s
        while True:
            left = [m for m in self.ctl.status().get("imports", [])
                    if m.get("owner_id") == owner_id and not m.get("idle")]
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.05)

    def setup(self, seed):
        import gmb
        from torch_common import my_tags

        torch = self.torch
        if not gmb.preload_active():
            raise RuntimeError("the trainer is not under libgmb_preload.so")
        if os.environ.get("GMB_DEFAULT_TAG") != "train":
            raise RuntimeError("the trainer needs GMB_DEFAULT_TAG=train")
        spec = weight_spec(self.args.weights_gib * GiB)
        weights = make_weights(spec, seed)
        torch.cuda.synchronize()
        client = gmb.default_client()
        lent = my_tags(client).get("train", {}).get("bytes", 0)
        total = spec_bytes(spec)
        if lent < total:
            raise RuntimeError(f"the weights are not in gmbd memory (tag train holds {lent} bytes)")
        log(f"[trainer] {len(spec)} bf16 tensors, {total / GiB:.2f} GiB, in gmbd tag train "
            f"({lent / GiB:.2f} GiB lent)")
        return spec, weights, client, total

    # --mode sglang

    def run_sglang(self):
        from torch_common import my_tags

        torch = self.torch
        a = self.args
        spec, weights, client, total = self.setup(seed=1)
        tensors = list(weights.values())
        self.spawn_engine(spec)
        eng, me = engine_name(a.mode), trainer_name(a.mode)
        self.ctl.timed("pause_engine", "pause", eng, "weights")  # as after a round
        sync_ms, held_seen, nbuckets, prev = [], [], 0, None
        for r in range(a.rounds):
            if r:  # every word changes: low mantissa bits flipped, never a NaN made
                mask = r % 127 + 1
                for t in tensors:
                    words(t).bitwise_xor_(mask)
            want = checksums(tensors)
            self.expect(want != prev, f"round {r}: the weights did not change")
            self.ctl.timed("resume_engine", "resume", eng, "weights")
            check = r in (0, a.rounds - 1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            groups = bucket_groups(weights, BUCKET_CAP)
            for i, group in enumerate(groups):
                bucket = flatten(group)
                if r == 0 and i == 0:
                    lent = my_tags(client).get("train", {}).get("bytes", 0)
                    self.expect(lent >= total + bucket["flattened_tensor"].numel(),
                                f"the bucket is not in gmbd memory (tag train holds {lent} bytes)")
                _, n, held = ask(self.conn, ("bucket", serialize(bucket), check and i == 0))
                self.expect(n == len(group), f"round {r} bucket {i}: {n} of {len(group)} tensors")
                if held is not None:
                    held_seen.append(held)
                    self.expect(held["imports"] >= 1 and held["bytes"] >= held["flat_bytes"],
                                f"round {r}: gmbd lists no import of the bucket the engine holds: {held}")
                del bucket
            sync_ms.append((time.perf_counter() - t0) * 1e3)
            nbuckets = len(groups)
            del groups, group
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()  # the buckets' segments go back to gmbd
            got = ask(self.conn, ("sums",))[1]
            self.expect(got == want, f"round {r}: the engine's checksums differ from the trainer's "
                                     f"({sum(x != y for x, y in zip(got, want))} of {len(want)})")
            left = self.imports_of_mine(client.id)
            self.expect(not left, f"round {r}: imports left after the engine loaded: {left}")
            # The engine runs; the trainer is paused (its weights to host memory).
            self.ctl.timed("pause_trainer", "pause", me, "train")
            ran = ask(self.conn, ("sums",))[1]
            self.expect(ran == want, f"round {r}: the engine's weights changed while it ran")
            self.ctl.timed("resume_trainer", "resume", me, "train")
            self.ctl.timed("pause_engine", "pause", eng, "weights")
            self.expect(checksums(tensors) == want, f"round {r}: the trainer's weights changed "
                                                    "across its pause")
            prev = want
            log(f"[trainer] round {r}: {nbuckets} buckets synced in {sync_ms[-1]:.1f} ms, "
                f"checksums {'equal' if got == want else 'DIFFER'}")
            if self.failures:
                break
        self.stop_engine()
        return {"tensors": len(spec), "bytes": total, "buckets": nbuckets, "sync_ms": sync_ms,
                "held": held_seen, "gmbctl_ms": {k: median(v) for k, v in self.ctl.times.items()}}

    # --mode vllm

    def run_vllm(self):
        from torch.multiprocessing.reductions import reduce_tensor

        torch = self.torch
        a = self.args
        spec, weights, client, total = self.setup(seed=2)
        tensors = list(weights.values())
        self.spawn_engine(spec)
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        sync_ms, held_seen, prev = [], [], None
        for r in range(a.rounds):
            if r:
                mask = r % 127 + 1
                for t in tensors:
                    words(t).bitwise_xor_(mask)
            want = checksums(tensors)
            self.expect(want != prev, f"round {r}: the weights did not change")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            entries = []
            for name, t in weights.items():  # IPCWeightTransferEngine.trainer_send_weights
                handle = reduce_tensor(t.detach().contiguous())
                entries.append({"name": name, "dtype": t.dtype, "shape": tuple(t.shape),
                                "ipc_handle": {uuid: handle}})
            _, n, held = ask(self.conn, ("vllm", pickle.dumps(entries), True))
            sync_ms.append((time.perf_counter() - t0) * 1e3)
            del entries
            torch.cuda.ipc_collect()
            self.expect(n == len(spec), f"round {r}: the engine loaded {n} of {len(spec)} tensors")
            held_seen.append(held)
            # gmbd lists the first 64 imports; each is a whole allocation of the trainer's.
            listed_all = held["imports_total"] == held["imports"]
            self.expect(held["imports"] >= 1 and (held["bytes"] >= total or not listed_all),
                        f"round {r}: gmbd lists too little imported while the engine holds "
                        f"every tensor: {held}")
            got = ask(self.conn, ("sums",))[1]
            self.expect(got == want, f"round {r}: the engine's checksums differ from the trainer's "
                                     f"({sum(x != y for x, y in zip(got, want))} of {len(want)})")
            left = self.imports_of_mine(client.id)
            self.expect(not left, f"round {r}: imports left after the engine loaded: {left}")
            prev = want
            log(f"[trainer] round {r}: {len(spec)} handles synced in {sync_ms[-1]:.1f} ms, "
                f"{held['imports']} imports while held, checksums "
                f"{'equal' if got == want else 'DIFFER'}")
            if self.failures:
                break
        self.stop_engine()
        return {"tensors": len(spec), "bytes": total, "sync_ms": sync_ms, "held": held_seen}

    # --mode kill

    def run_kill(self):
        torch = self.torch
        spec, weights, client, total = self.setup(seed=3)
        bucket = flatten(list(weights.items())[:3])["flattened_tensor"]
        sent = list(weights.items()) + [("bucket", bucket),
                                        ("bucket.view", bucket[1000:1000 + 8 * MiB])]
        torch.cuda.synchronize()
        want = checksums([t for _, t in sent])
        self.spawn_engine(None, self.args.driver_addr)
        self.conn.send(("tensors", sent))  # torch.multiprocessing: reduce_tensor per tensor
        rep = answer(self.conn, WAIT_S)
        if rep[0] != "holding":
            raise RuntimeError(f"the engine answered {rep}")
        self.say("HOLDING", {"engine_pid": rep[1], "trainer_pid": os.getpid(),
                             "owner_id": client.id, "tensors": len(sent),
                             "bytes": total + bucket.numel(), "match": rep[2] == want})
        sys.stdin.readline()  # the driver kills us here; EOF: it went away
        raise RuntimeError("the driver did not kill the trainer")


def trainer_main(args):
    # The protocol to the driver gets a descriptor of its own; fd 1 becomes
    # stderr for everything else, the spawned engine included.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, HERE)
    report = {"failures": []}
    tr = None
    try:
        tr = Trainer(args, proto)
        report.update(getattr(tr, f"run_{args.mode}")())
        report["failures"] = tr.failures
    except Exception as e:  # noqa: BLE001 - one report whatever happens
        traceback.print_exc()
        report["failures"] = (tr.failures if tr else []) + [f"{type(e).__name__}: {e}"]
        if tr is not None and tr.engine is not None and tr.engine.is_alive():
            tr.engine.kill()
            tr.engine.join(10)
    proto.write(f"TRAINER {json.dumps(report)}\n")
    proto.flush()
    return 0 if not report["failures"] else 1
