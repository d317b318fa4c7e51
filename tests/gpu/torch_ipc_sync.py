"""torch_ipc_sync.py - RL weight updates through CUDA IPC on gmbd memory, the
way SGLang and vLLM make them, and an exporter killed while imported.

    torch_ipc_sync.py --mode sglang|vllm|kill --gmbctl build-gpu/gmbctl [--rounds N]

Three processes:

  driver   this one: no shim, not a gmbd client. Its CUDA context only reads
           the driver's free memory (torch.cuda.mem_get_info) before the
           trainer starts and after everything exited; it reads gmbd's state
           with `gmbctl status --json`.
  trainer  this script again (--role trainer) under LD_PRELOAD=libgmb_preload.so
           with GMB_DEFAULT_TAG=train (preserve) and GMB_CONTROL=accept: every
           allocation of the process is gmbd's, and gmbctl can pause it.
  engine   a torch.multiprocessing spawn child of the trainer, under the shim
           too but without the trainer's default tag; its weights are made in
           gmb.torch_memory_saver's region(tag="weights") (discard, SGLang's
           default: every byte after a resume comes from the next update).

--mode sglang  (20 rounds) the trainer holds 4 GiB of bf16 weights (tensors of
   2-100 MiB, mixed shapes). Each round it packs them into flattened buckets of
   at most 512 MiB (SGLang's FlattenedTensorBucket: the tensors' bytes
   concatenated into one uint8 buffer, names, shapes, dtypes and offsets
   beside it), serializes each bucket with ForkingPickler (SGLang's
   MultiprocessingSerializer: torch.multiprocessing's reduce_tensor, so
   cudaIpcGetMemHandle) and sends the bytes; the engine deserializes them
   (rebuild_cuda_tensor, so cudaIpcOpenMemHandle), copies each tensor into its
   own weights, drops what it received and calls torch.cuda.ipc_collect().
   The engine's checksums (computed on its GPU) must equal the trainer's.
   Between rounds gmbctl pauses and resumes both sides: the trainer's "train"
   while the engine runs, the engine's "weights" while the trainer changes
   every weight in place (so each round's bytes differ); the trainer's
   weights must survive its pause. Prints the median sync time.
--mode vllm    (5 rounds) 2 GiB: vLLM's IPC weight transfer. Per tensor
   reduce_tensor(t.detach().contiguous()), keyed by the GPU's UUID; the
   engine takes the entry of its own GPU's UUID, puts its own device index in
   args[6] and calls func(*args), then loads the weights as above.
--mode kill    a 1 GiB set of tensors and a flattened bucket with a view into
   it go to the engine through a torch.multiprocessing pipe; the driver
   SIGKILLs the trainer while the engine holds them. gmbctl status must show
   the imports with their owner gone (owner_freed), the engine must still read
   every byte it received, and after it closed them no import is left.

Every mode then checks, once both processes are gone: `gmbctl status --json`
lists no import and no client of theirs, gmbd holds no more than before, and
the driver's free memory is within 64 MiB of what it was before the trainer
started (run against a gmbd with --pool-keep 0, gmbd's default, so that
freed memory goes back to the driver; tests/gpu/torch_run.sh starts one).

Needs $GMB_SOCKET, $GMB_PRELOAD_LIB (or libgmb_preload.so next to $GMB_LIB),
PYTHONPATH with client/python and tests/gpu. Prints "RESULT: PASS|FAIL -
detail" last; the exit status follows it.
"""

import argparse
import gc
import importlib
import io
import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
GiB = 1 << 30
FREE_SLACK = 64 * MiB
BUCKET_CAP = 512 * MiB
DEFAULTS = {  # rounds, GiB of weights
    "sglang": (20, 4),
    "vllm": (5, 2),
    "kill": (1, 1),
}
# A decoder layer's bf16 shapes, every one 2-100 MiB; "odd" has a size that is
# no multiple of any granularity, so the offsets after it are ragged.
LAYER = (("q", (4096, 4096)), ("k", (1024, 4096)), ("v", (1024, 4096)), ("o", (4096, 4096)),
         ("gate", (11008, 4096)), ("up", (11008, 4096)), ("down", (4096, 11008)),
         ("norm", (1024, 1024)), ("odd", (1000, 1537)))
WAIT_S = 120  # for one answer from the other process


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def trainer_name(mode):
    return f"ipc-trainer-{mode}"


def engine_name(mode):
    return f"ipc-engine-{mode}"


# Weights, buckets, checksums (trainer, engine and bench/ipc_bench.py).

def weight_spec(total):
    """[(name, shape)] of bf16 tensors of 2-100 MiB adding up to at least ``total`` bytes."""
    spec, n, layer = [], 0, 0
    while n < total:
        for part, shape in LAYER:
            spec.append((f"layers.{layer}.{part}", shape))
            n += shape[0] * shape[1] * 2
            if n >= total:
                break
        layer += 1
    return spec


def spec_bytes(spec):
    return sum(s[0] * s[1] * 2 for _, s in spec)


def make_weights(spec, seed):
    """{name: bf16 tensor} on the current device, seeded (the same bytes every run)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return {name: torch.randn(shape, generator=g, dtype=torch.bfloat16, device="cuda")
            for name, shape in spec}


def words(t):
    """``t``'s bytes as integers of its element size (a view, no copy when contiguous)."""
    import torch

    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().reshape(-1).view(kind)


def checksums(tensors):
    """Two int64 per tensor, computed on the GPU: the sum of its words read as
    integers, and the sum of every 7th word (a shifted or stale range changes
    both). One synchronization for the whole list."""
    import torch

    parts = []
    for t in tensors:
        w = words(t)
        parts.append(torch.sum(w, dtype=torch.int64))
        parts.append(torch.sum(w[::7], dtype=torch.int64))
    return torch.stack(parts).tolist() if parts else []


def flatten(group):
    """SGLang's FlattenedTensorBucket: one uint8 buffer holding the tensors'
    bytes back to back, and per tensor its name, shape, dtype and byte range."""
    import torch

    meta, parts, off = [], [], 0
    for name, t in group:
        flat = t.detach().reshape(-1).view(torch.uint8)
        meta.append({"name": name, "shape": tuple(t.shape), "dtype": t.dtype,
                     "start": off, "end": off + flat.numel()})
        parts.append(flat)
        off += flat.numel()
    return {"flattened_tensor": torch.cat(parts), "metadata": meta}


def bucket_groups(weights, cap):
    """The weights in order, cut into groups of at most ``cap`` bytes (a larger
    tensor is a group of its own)."""
    groups, group, size = [], [], 0
    for name, t in weights.items():
        nb = t.numel() * t.element_size()
        if group and size + nb > cap:
            groups.append(group)
            group, size = [], 0
        group.append((name, t))
        size += nb
    if group:
        groups.append(group)
    return groups


def forking_pickler():
    """multiprocessing's ForkingPickler, with torch.multiprocessing's reductions
    registered (its import does that: reduce_tensor for CUDA tensors)."""
    importlib.import_module("torch.multiprocessing")
    from multiprocessing.reduction import ForkingPickler

    return ForkingPickler


def serialize(obj):
    """SGLang's MultiprocessingSerializer.serialize."""
    buf = io.BytesIO()
    forking_pickler()(buf).dump(obj)
    return buf.getvalue()


def deserialize(data):
    """SGLang's MultiprocessingSerializer.deserialize: rebuild_cuda_tensor runs."""
    return forking_pickler().loads(data)


def ask(conn, msg, timeout=WAIT_S):
    """Sends ``msg`` to the other process and returns its answer; an "error" answer raises."""
    conn.send(msg)
    return answer(conn, timeout)


def answer(conn, timeout=WAIT_S):
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer within {timeout} s")
    rep = conn.recv()
    if isinstance(rep, tuple) and rep and rep[0] == "error":
        raise RuntimeError(f"the other process: {rep[1]}")
    return rep


def my_imports(client):
    """(imports listed by gmbd whose importer is this process, imports_total)."""
    st = client.status()
    pid = os.getpid()
    return [m for m in st.get("imports", []) if m.get("importer_pid") == pid], st.get("imports_total")


def strip_env(env):
    """The environment without the shim and the worker settings (for gmbctl)."""
    drop = ("LD_PRELOAD", "GMB_DEFAULT_TAG", "GMB_DEFAULT_MODE", "GMB_CONTROL", "GMB_CLIENT_NAME")
    return {k: v for k, v in env.items() if k not in drop}


class Ctl:
    """gmbctl, run as a program (as an operator would), its wall time kept per verb."""

    def __init__(self, path):
        self.path = path
        self.times = {}

    def __call__(self, *argv, timeout=120):
        t0 = time.monotonic()
        p = subprocess.run([self.path, *argv], capture_output=True, text=True, timeout=timeout,
                           env=strip_env(os.environ))
        dt = (time.monotonic() - t0) * 1e3
        if p.returncode != 0:
            raise RuntimeError(f"gmbctl {' '.join(argv)}: exit {p.returncode}: "
                               f"{(p.stderr or p.stdout).strip()}")
        return p.stdout, dt

    def timed(self, key, *argv):
        out, dt = self(*argv)
        self.times.setdefault(key, []).append(dt)
        return out

    def status(self):
        return json.loads(self("status", "--json")[0])


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


# The driver (no shim, not a gmbd client).

class Driver:
    def __init__(self, args):
        self.args = args
        self.ctl = Ctl(args.gmbctl)
        self.failures = []
        self.lines = queue.Queue()
        self.trainer = None
        self.engine_pid = None

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"[driver] FAILED: {what}")
        return ok

    def start_trainer(self, driver_addr=None):
        import gmb

        a = self.args
        env = dict(os.environ, LD_PRELOAD=gmb.preload_path(), GMB_DEFAULT_TAG="train",
                   GMB_DEFAULT_MODE="preserve", GMB_CONTROL="accept",
                   GMB_CLIENT_NAME=trainer_name(a.mode), PYTHONUNBUFFERED="1")
        argv = [sys.executable, os.path.abspath(__file__), "--role", "trainer", "--mode", a.mode,
                "--gmbctl", a.gmbctl, "--rounds", str(a.rounds), "--weights-gib",
                str(a.weights_gib)]
        if driver_addr:
            argv += ["--driver-addr", driver_addr]
        self.trainer = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        threading.Thread(target=self._read, args=(self.trainer.stdout,), daemon=True).start()

    def _read(self, f):
        for line in f:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, kind, timeout):
        """The trainer's next KIND line's object; ENGINE lines are noted on the way."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} line from the trainer within {timeout} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the trainer exited ({self.trainer.wait(30)}) before its "
                                   f"{kind} line")
            k, _, rest = line.partition(" ")
            if k == "ENGINE":
                self.engine_pid = json.loads(rest)["pid"]
            elif k == kind:
                return json.loads(rest)
            elif k == "TRAINER":
                rep = json.loads(rest)
                raise RuntimeError(f"the trainer stopped: {'; '.join(rep['failures'][:3])}")
            else:
                log(f"[driver] from the trainer: {line}")

    def ours(self, st):
        names = (trainer_name(self.args.mode), engine_name(self.args.mode))
        return [c for c in st["clients"] if c["name"] in names]

    def wait_status(self, pred, what, timeout=10.0):
        """gmbctl status --json until ``pred(status)``; the last status either way."""
        end = time.monotonic() + timeout
        while True:
            st = self.ctl.status()
            if pred(st):
                return st
            if time.monotonic() > end:
                self.expect(False, f"{what} (after {timeout:.0f} s)")
                return st
            time.sleep(0.1)

    def wait_free(self, free0, torch):
        """The driver's free memory, waited for (20 s at most) to come within FREE_SLACK of free0."""
        end = time.monotonic() + 20
        while True:
            free = torch.cuda.mem_get_info(0)[0]
            if abs(free - free0) <= FREE_SLACK or time.monotonic() > end:
                return free
            time.sleep(0.2)

    def cleanup(self):
        """Kills what is left of ours: the trainer (our child) and the engine (its child)."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
            self.trainer.wait(30)
        if self.engine_pid and pid_alive(self.engine_pid):
            try:
                os.kill(self.engine_pid, signal.SIGKILL)
            except OSError:
                pass
            wait_gone(self.engine_pid, 30)

    def run(self):
        import torch

        a = self.args
        torch.cuda.init()
        free0 = torch.cuda.mem_get_info(0)[0]
        st0 = self.ctl.status()
        held0 = st0["devices"][0]["held_bytes"]
        self.expect(not self.ours(st0), f"clients of an earlier run still there: {self.ours(st0)}")
        log(f"[driver] before: driver free {free0 / GiB:.3f} GiB, gmbd holds {held0 / GiB:.3f} GiB, "
            f"{st0.get('imports_total', 0)} imports")
        if a.mode == "kill":
            detail = self.run_kill()
        else:
            detail = self.run_sync()
        # Both processes are gone: nothing of theirs may be left anywhere.
        st = self.wait_status(lambda s: not s.get("imports") and not s.get("imports_total")
                              and not self.ours(s), "imports or clients left after both exited")
        st = self.wait_status(lambda s: s["devices"][0]["held_bytes"] <= held0,
                              f"gmbd holds more than the {held0} bytes it held before")
        free1 = self.wait_free(free0, torch)
        delta = (free1 - free0) / MiB
        self.expect(abs(free1 - free0) <= FREE_SLACK,
                    f"the driver's free memory is {delta:+.0f} MiB from before the trainer started "
                    f"(allowed: {FREE_SLACK // MiB} MiB)")
        log(f"[driver] after: driver free {free1 / GiB:.3f} GiB ({delta:+.1f} MiB), gmbd holds "
            f"{st['devices'][0]['held_bytes'] / GiB:.3f} GiB, {st.get('imports_total', 0)} imports")
        return f"{detail}; after both exited: no import, no client left, driver free {delta:+.1f} MiB"

    def run_sync(self):
        a = self.args
        self.start_trainer()
        rep = self.line("TRAINER", a.timeout)
        rc = self.trainer.wait(60)
        for f in rep["failures"]:
            self.expect(False, f"trainer: {f}")
        self.expect(rc == 0, f"the trainer exited {rc}")
        if rep["failures"]:
            return f"{a.mode}: failed"
        s = rep["sync_ms"]
        held = rep["held"]
        imports = max(h["imports"] for h in held) if held else 0
        head = (f"{a.mode}: {len(s)} rounds of {rep['bytes'] / GiB:.2f} GiB "
                f"({rep['tensors']} bf16 tensors of 2-100 MiB")
        if a.mode == "sglang":
            g = rep["gmbctl_ms"]
            detail = (f"{head} in {rep['buckets']} flattened buckets of at most "
                      f"{BUCKET_CAP // MiB} MiB) bit-exact every round; sync median {median(s):.1f} ms "
                      f"(min {min(s):.1f}, max {max(s):.1f}); imports listed while held; none left "
                      f"after each round; paused and resumed by gmbctl each round (median ms: trainer "
                      f"pause {g['pause_trainer']:.1f} / resume {g['resume_trainer']:.1f}, engine "
                      f"pause {g['pause_engine']:.1f} / resume {g['resume_engine']:.1f}), the trainer's "
                      f"weights intact")
        else:
            rw = held[0].get("rewritten", 0) if held else 0
            detail = (f"{head}, one reduce_tensor each, keyed by GPU UUID, args[6] set to the "
                      f"engine's device ({rw} differed)) bit-exact every round; sync median "
                      f"{median(s):.1f} ms (min {min(s):.1f}, max {max(s):.1f}); up to {imports} imports "
                      f"listed while held, none left after each round")
        log(f"[driver] sync times (ms): {' '.join(f'{x:.1f}' for x in s)}")
        return detail

    def run_kill(self):
        from multiprocessing.connection import Listener

        a = self.args
        tmp = tempfile.mkdtemp(prefix="gmb-ipc-kill.")
        addr = os.path.join(tmp, "driver.sock")
        listener = Listener(addr, family="AF_UNIX")
        try:
            self.start_trainer(addr)
            hold = self.line("HOLDING", a.timeout)
            self.engine_pid = hold["engine_pid"]
            eng = listener.accept()  # the engine connected before it took the tensors
            self.expect(hold["match"], "the engine's checksums differ from the trainer's")
            pid, tpid = hold["engine_pid"], hold["trainer_pid"]

            def imports(st):
                return [m for m in st.get("imports", []) if m.get("importer_pid") == pid]

            st = self.ctl.status()
            before = imports(st)
            self.expect(before and all(m["owner_pid"] == tpid and not m["owner_freed"] for m in before),
                        f"imports while the owner lives: {before}")
            self.expect(sum(m["bytes"] for m in before) >= hold["bytes"],
                        f"gmbd lists {sum(m['bytes'] for m in before)} bytes imported, "
                        f"{hold['bytes']} were sent")
            t0 = time.monotonic()
            self.trainer.kill()  # SIGKILL: nothing of the exporter's runs again
            self.trainer.wait(30)
            st = self.wait_status(
                lambda s: not any(c["pid"] == tpid for c in s["clients"])
                and len(imports(s)) == len(before) and all(m["owner_freed"] for m in imports(s)),
                "after the kill: the owner still listed, or its imports not marked owner_freed")
            gone_ms = (time.monotonic() - t0) * 1e3
            after = imports(st)
            log("[driver] gmbctl status after the kill:\n" + self.ctl("status")[0])
            chk = ask(eng, "check")
            self.expect(chk["equal"] and chk["sums_same"],
                        f"the engine reads other bytes after its exporter was killed: {chk}")
            self.expect(chk["imports"] == len(before) and all(chk["owner_freed"]),
                        f"the engine's view of its imports after the kill: {chk}")
            time.sleep(1.0)  # and a while later, still the same bytes
            chk2 = ask(eng, "check")
            self.expect(chk2["equal"] and chk2["sums_same"], f"a second read after the kill: {chk2}")
            held_dead = self.ctl.status()["devices"][0]["held_bytes"]
            closed = ask(eng, "close")
            self.expect(closed.get("closed") and closed.get("imports_left") == 0,
                        f"the engine's close: {closed}")
            self.wait_status(lambda s: not imports(s), "imports left after the engine closed them")
            ask(eng, "quit")
            eng.close()
            self.expect(wait_gone(pid, 60), f"the engine (pid {pid}) did not exit")
        finally:
            listener.close()  # removes the socket file too
            for f in (lambda: os.unlink(addr), lambda: os.rmdir(tmp)):
                try:
                    f()
                except OSError:
                    pass
        return (f"kill: {hold['tensors']} tensors ({hold['bytes'] / GiB:.2f} GiB, a flattened bucket "
                f"and a view into it among them) held by a spawned child when its exporter was "
                f"SIGKILLed: {len(after)} imports listed with the owner gone (owner_freed) "
                f"{gone_ms:.0f} ms after the kill, gmbd keeping {held_dead / GiB:.2f} GiB for them; "
                f"every byte still read right, twice; none left once the child closed them")


def pid_alive(pid):
    """Whether ``pid`` runs (a zombie has let go of everything: it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid, timeout):
    end = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("sglang", "vllm", "kill"), required=True)
    ap.add_argument("--gmbctl", required=True, help="gmbctl to run (build-gpu/gmbctl)")
    ap.add_argument("--rounds", type=int, help="rounds of updates (sglang 20, vllm 5)")
    ap.add_argument("--weights-gib", type=float, help="the trainer's weights (sglang 4, vllm 2, kill 1)")
    ap.add_argument("--timeout", type=float, default=150, help="seconds the trainer may take")
    ap.add_argument("--role", choices=("driver", "trainer"), default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--driver-addr", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rounds, gib = DEFAULTS[args.mode]
    args.rounds = args.rounds or rounds
    args.weights_gib = args.weights_gib or gib
    sys.path.insert(0, HERE)
    if args.role == "trainer":
        return trainer_main(args)
    drv = Driver(args)
    try:
        detail = drv.run()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        traceback.print_exc()
        drv.failures.append(f"{type(e).__name__}: {e}")
        detail = ""
    finally:
        drv.cleanup()
    if drv.failures:
        print(f"RESULT: FAIL - {args.mode}: " + "; ".join(drv.failures[:3]), flush=True)
        return 1
    print(f"RESULT: PASS - {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
