"""torch_ipc_common.py - what the CUDA IPC weight-update scripts share: the
weights, SGLang's flattened buckets, checksums, serialization, the pipe
protocol and gmbctl.

  weights      bf16 tensors of 2-100 MiB in a decoder layer's shapes (LAYER),
               seeded, so every run makes the same bytes
  buckets      SGLang's FlattenedTensorBucket (flatten) and its cut into
               groups of at most BUCKET_CAP bytes (bucket_groups)
  checksums    two int64 per tensor, computed on the GPU
  serialize    SGLang's MultiprocessingSerializer: ForkingPickler with
               torch.multiprocessing's reductions (CUDA IPC handles)
  ask/answer   one message and its answer over a multiprocessing pipe; an
               ("error", why) answer raises
  Ctl          gmbctl run as a program, its wall time kept per verb

torch_ipc_sync.py (the driver), torch_ipc_workers.py (its trainer and
engine), bench/ipc_bench.py, tests/gpu/torch_objects.py and objects_roles.py
import these.
torch is imported inside the functions that use it: the module itself needs
only the standard library.
"""

import importlib
import io
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
BUCKET_CAP = 512 * MiB
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
