"""objects_roles.py - the processes of tests/gpu/torch_objects.py other than its
driver, and the model they share.

The torch.multiprocessing spawn children (ROLES: trainer, reader, publisher,
looper, faulter, checker, holder) start in child_entry; torch_objects.py's
Driver.spawn passes it as the target. Spawn pickles it by module and name, so
a child runs torch_objects.py's top again (as __mp_main__, which imports this
module) and then finds child_entry here, on the sys.path the driver hands it
(tests/gpu first). Each role answers on its pipe; an exception goes to the
driver as ("error", text).

The engines of --case restart (engine_main) are torch_objects.py started
again with --role engine | file-engine: their clock starts at the top of that
script (its T_MODULE, passed in), before torch is imported.

The model: a transformer-shaped bf16 TinyLM (torch_common) built on the meta
device or filled from a seeded CUDA generator, its forward, and hashes and
checksums of its bytes; the driver sizes it with layers_for.

Every role is a gmbd client through gmb.default_client() and gmb.objects,
without the preload shim.
"""

import gc
import hashlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback

import torch

from torch_common import TinyLM, median, prompt_tokens  # (cuDNN attention off)
from torch_ipc_common import checksums, make_weights, spec_bytes, weight_spec

MiB = 1 << 20
GiB = 1 << 30
# The model: d 4096, 32 heads (head dim 128: flash attention, deterministic),
# per block qkv 96 MiB, proj 32 MiB, fc1/fc2 128 MiB (+ biases and norms of
# 8-32 KiB); embedding and head 250 MiB each.
VOCAB, D, HEADS = 32000, 4096, 32
BATCH, SEQ = 4, 256


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# The model and its bytes (every role).

def layers_for(gib):
    """Blocks of TinyLM(d=4096) for at least ``gib`` GiB of bf16 parameters."""
    per_block = 2 * (3 * D * D + 3 * D + D * D + D + 4 * D * D + 4 * D + 4 * D * D + D + 4 * D)
    ends = 2 * (2 * VOCAB * D + 2 * D)
    return max(1, -(-(int(gib * GiB) - ends) // per_block))


def build_model(layers, seed=None):
    """The model on the meta device (``seed`` None: no memory, for load_state_dict(assign=True)),
    or on the GPU with every tensor drawn from a seeded CUDA generator."""
    with torch.device("meta"):
        m = TinyLM(vocab=VOCAB, d=D, heads=HEADS, layers=layers).to(torch.bfloat16)
    m.eval()
    if seed is None:
        return m
    m = m.to_empty(device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            for pname, p in mod.named_parameters(recurse=False):
                # LayerNorm weights near 1, everything else small: the
                # residual stream stays finite through every block.
                mean = 1.0 if isinstance(mod, torch.nn.LayerNorm) and pname == "weight" else 0.0
                p.normal_(mean, 0.02, generator=g)
    torch.cuda.synchronize()
    return m


def forward(model, tokens):
    """The last position's logits (no KV cache): causal attention over the prompt."""
    with torch.no_grad():
        x = model.emb(tokens)
        for blk in model.blocks:
            x = blk(x)
        return model.head(model.ln_f(x[:, -1]))


def out_hash(t):
    """The bytes of ``t`` (synchronizes), as a short hex digest."""
    w = t.detach().contiguous().reshape(-1).view(torch.int16).cpu().tolist()
    return hashlib.sha256(json.dumps(w).encode()).hexdigest()[:16]


def sd_bytes(sd):
    return sum(t.numel() * t.element_size() for t in sd.values())


def sd_sums(sd):
    """Two int64 per tensor (torch_ipc_common.checksums), in name order."""
    return checksums([sd[k] for k in sorted(sd)])


def sums_hash(sums):
    return hashlib.sha256(json.dumps(sums).encode()).hexdigest()[:16]


def cuda_ready():
    """This process's context made (and a kernel loaded), so nothing timed after pays for it."""
    torch.cuda.init()
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()


def release_publisher(client, name, version):
    """Let go of the publisher's own open of ``version`` (publish_state_dict keeps the
    pointer to itself): opening a version this client has open maps nothing new and
    gives the same pointer, so open once and close twice."""
    ptr, _, _ = client.object_open(name, version)
    client.object_close(ptr)
    client.object_close(ptr)


class TimedClient:
    """A gmb.Client for gmb.objects whose object_open is timed (libgmb's part of an open)."""

    def __init__(self, client):
        self.client = client
        self.open_ms = None

    def object_open(self, name, version=0):
        t0 = time.perf_counter()
        r = self.client.object_open(name, version)
        self.open_ms = (time.perf_counter() - t0) * 1e3
        return r

    def object_close(self, ptr):
        self.client.object_close(ptr)


def ms_since(t0):
    return (time.perf_counter() - t0) * 1e3


# The children (torch.multiprocessing spawn). Each answers on its pipe; an
# exception goes to the driver as ("error", text).

def child_entry(role, conn, p):
    try:
        ROLES[role](conn, p)
    except Exception as e:  # noqa: BLE001 - the driver reports it
        traceback.print_exc()
        try:
            conn.send(("error", f"{role}: {type(e).__name__}: {e}"))
        except OSError:
            pass


def role_trainer(conn, p):
    """readers, restart: the model, its reference output, its state dict published
    (restart: also saved to p["file"]); answers ("published", facts), exits on "quit"."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    model = build_model(p["layers"], seed=p["seed"])
    ref = out_hash(forward(model, prompt_tokens(BATCH, SEQ, VOCAB)))
    sd = model.state_dict()
    nbytes, ntensors = sd_bytes(sd), len(sd)
    sizes = sorted(t.numel() * t.element_size() for t in sd.values())
    t0 = time.perf_counter()
    version = objects.publish_state_dict(p["name"], sd, client=client)
    publish_ms = ms_since(t0)
    release_publisher(client, p["name"], version)
    fmt = None
    if p.get("file"):
        fmt = save_file(sd, p["file"])
    del sd, model
    gc.collect()
    torch.cuda.empty_cache()
    conn.send(("published", {"version": version, "bytes": nbytes, "tensors": ntensors,
                             "ref": ref, "publish_ms": publish_ms, "format": fmt,
                             "min_tensor": sizes[0], "max_tensor": sizes[-1],
                             "big_tensors": sum(s >= 2 * MiB for s in sizes)}))
    conn.recv()
    conn.send(("bye",))


def save_file(sd, path):
    """The state dict's bytes in a file: safetensors if importable, else torch.save.
    The format's name."""
    cpu = {k: t.detach().cpu() for k, t in sd.items()}
    if importlib.util.find_spec("safetensors") is not None:
        from safetensors.torch import save_file as st_save

        st_save(cpu, path)
        fmt = "safetensors"
    else:
        torch.save(cpu, path)
        fmt = "torch.save"
    del cpu
    return fmt


def role_reader(conn, p):
    """readers: opens on "open", runs the forward on "forward", closes on "close"."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    model = build_model(p["layers"])
    tokens = prompt_tokens(BATCH, SEQ, VOCAB)
    conn.send(("ready", os.getpid(), client.id))
    conn.recv()  # ("open",)
    tc = TimedClient(client)
    t0 = time.perf_counter()
    sd, h = objects.open_state_dict(p["name"], client=tc)
    open_ms = ms_since(t0)
    t1 = time.perf_counter()
    model.load_state_dict(sd, assign=True)
    load_ms = ms_since(t1)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"left on the meta device after load_state_dict: {left[:3]}")
    conn.send(("opened", {"open_ms": open_ms, "object_open_ms": tc.open_ms, "load_ms": load_ms,
                          "version": h.version, "size": h.info["size"], "tensors": len(sd)}))
    conn.recv()  # ("forward",)
    t2 = time.perf_counter()
    out = forward(model, tokens)
    torch.cuda.synchronize()
    fwd_ms = ms_since(t2)
    conn.send(("output", {"hash": out_hash(out), "forward_ms": fwd_ms}))
    conn.recv()  # ("close",)
    del model, sd, out
    gc.collect()
    torch.cuda.synchronize()
    h.close()
    conn.send(("closed",))


def role_publisher(conn, p):
    """versions, readonly, pause: publishes p["versions"] versions of a p["gib"] GiB state
    dict (tensors of 2-100 MiB, torch_ipc_common's shapes), seeded p["seed"] + version,
    each version's checksum written to p["record"] once committed. After the first:
    ("published", facts) and waits for "more" (if more are to come); at the end
    ("done", facts) and waits for "quit"."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    spec = weight_spec(int(p["gib"] * GiB))
    recorded, publish_ms = [], []
    n = p.get("versions", 1)
    for i in range(n):
        sd = make_weights(spec, p["seed"] + i)
        sums = sd_sums(sd)
        t0 = time.perf_counter()
        v = objects.publish_state_dict(p["name"], sd, client=client)
        publish_ms.append(ms_since(t0))
        release_publisher(client, p["name"], v)
        del sd
        torch.cuda.empty_cache()
        rec = {"version": v, "hash": sums_hash(sums), "sums": sums}
        recorded.append(rec)
        if p.get("record"):
            with open(p["record"], "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
        facts = {"version": v, "bytes": spec_bytes(spec), "tensors": len(spec),
                 "hash": rec["hash"], "sums": sums, "publish_ms": publish_ms}
        if i == 0:
            conn.send(("published", facts))
            if n > 1:
                conn.recv()  # ("more",)
        elif p.get("gap_s"):
            time.sleep(p["gap_s"])
    conn.send(("done", {"versions": [r["version"] for r in recorded], "publish_ms": publish_ms}))
    conn.recv()  # ("quit",)
    conn.send(("bye",))


def role_looper(conn, p):
    """versions: open the latest, checksum every tensor, close; until the driver says
    "stop" (polled between rounds). Answers ("seen", facts)."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    conn.send(("ready", os.getpid(), client.id))
    conn.recv()  # ("go",)
    seen, open_ms, rounds, busy = {}, [], 0, 0
    stop = False
    while not stop:
        stop = conn.poll()  # one more round after "stop": the last version read too
        t0 = time.perf_counter()
        try:
            sd, h = objects.open_state_dict(p["name"], client=client)
        except gmb.GmbError as e:
            busy += 1
            log(f"[looper {os.getpid()}] open: {e}")
            time.sleep(0.01)
            continue
        open_ms.append(ms_since(t0))
        sums = sd_sums(sd)  # .tolist(): the kernels are done before the close
        del sd
        h.close()
        seen.setdefault(str(h.version), set()).add(sums_hash(sums))
        rounds += 1
    conn.recv()  # the "stop"
    conn.send(("seen", {"seen": {v: sorted(s) for v, s in seen.items()}, "rounds": rounds,
                        "open_ms": median(open_ms), "refused": busy}))


def role_faulter(conn, p):
    """readonly: a write into the version by a kernel of this process. Reports what
    happened and exits at once (after a CUDA error the context is lost)."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    sd, h = objects.open_state_dict(p["name"], client=client)
    name = sorted(sd)[0]
    t = sd[name]
    before = checksums([t])
    view = t.reshape(-1)[1000:1000 + 4096]  # a view at an offset, inside the version
    try:
        view.add_(1)
        torch.cuda.synchronize()
        rep = ("wrote", {"tensor": name, "before": before, "after": checksums([t]),
                         "ptr": view.data_ptr()})
    except Exception as e:  # noqa: BLE001 - the CUDA error is what is wanted
        rep = ("fault", {"tensor": name, "error": f"{type(e).__name__}: {e}".strip()[:600],
                         "ptr": view.data_ptr()})
    conn.send(rep)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def role_checker(conn, p):
    """readonly: opens the latest version, answers its checksums and version, closes."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    sd, h = objects.open_state_dict(p["name"], client=client)
    sums = sd_sums(sd)
    del sd
    h.close()
    conn.send(("sums", {"version": h.version, "sums": sums}))


def role_holder(conn, p):
    """pause: holds the version open; "sums" -> its checksums and its tensors' data_ptr()
    (the device drained before answering: nothing of ours runs while the driver pauses);
    "close" closes and exits."""
    import gmb
    from gmb import objects

    cuda_ready()
    client = gmb.default_client()
    sd, h = objects.open_state_dict(p["name"], client=client)
    names = sorted(sd)
    ptrs = [sd[k].data_ptr() for k in names]
    conn.send(("ready", os.getpid(), client.id))
    while True:
        msg = conn.recv()
        if msg[0] == "sums":
            sums = sd_sums(sd)
            torch.cuda.synchronize()
            conn.send(("sums", {"sums": sums, "ptrs": [sd[k].data_ptr() for k in names],
                                "ptrs_same": [sd[k].data_ptr() for k in names] == ptrs,
                                "version": h.version}))
        elif msg[0] == "close":
            del sd
            gc.collect()
            torch.cuda.synchronize()
            h.close()
            conn.send(("closed",))
            return


ROLES = {"trainer": role_trainer, "reader": role_reader, "publisher": role_publisher,
         "looper": role_looper, "faulter": role_faulter, "checker": role_checker,
         "holder": role_holder}


# The engines of --case restart: programs of their own (--role engine | file-engine).

def engine_main(args, t_module):
    """Opens the object (or loads the file), runs the first forward, prints
    "FIRST {json}" on stdout; then waits for a line on stdin and exits. ``t_module``:
    time.monotonic() at the top of torch_objects.py, before its imports."""
    t_py = time.monotonic()  # our imports (torch among them) done
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's look at a stuck engine
    cuda_ready()
    t_ctx = time.monotonic()
    model = build_model(args.layers)
    tokens = prompt_tokens(BATCH, SEQ, VOCAB)
    rep = {"pid": os.getpid(), "module_s": t_module, "imports_s": t_py - t_module,
           "context_s": t_ctx - t_py}
    handle = None
    t0 = time.perf_counter()
    if args.role == "engine":
        import gmb
        from gmb import objects

        client = gmb.default_client()
        client.id  # noqa: B018 - connected before the open is timed
        rep["connect_ms"] = ms_since(t0)
        t1 = time.perf_counter()
        tc = TimedClient(client)
        sd, handle = objects.open_state_dict(args.name, client=tc)
        rep["open_ms"], rep["object_open_ms"] = ms_since(t1), tc.open_ms
        rep["version"] = handle.version
    else:
        t1 = time.perf_counter()
        if args.format == "safetensors":
            from safetensors.torch import load_file

            cpu = load_file(args.file, device="cpu")
        else:
            cpu = torch.load(args.file, mmap=True, weights_only=True, map_location="cpu")
        rep["read_ms"] = ms_since(t1)
        t2 = time.perf_counter()
        sd = {k: v.to("cuda") for k, v in cpu.items()}
        torch.cuda.synchronize()
        rep["copy_ms"] = ms_since(t2)
        rep["open_ms"] = ms_since(t1)  # file to GPU: what an open replaces
        del cpu
    t3 = time.perf_counter()
    model.load_state_dict(sd, assign=True)
    rep["load_ms"] = ms_since(t3)
    t4 = time.perf_counter()
    out = forward(model, tokens)
    torch.cuda.synchronize()
    rep["forward_ms"] = ms_since(t4)
    rep["hash"] = out_hash(out)
    rep["open_forward_ms"] = ms_since(t1)  # the open (or read + copy) to the first output
    rep["first_s"] = time.monotonic()  # CLOCK_MONOTONIC: the driver's clock too
    print("FIRST " + json.dumps(rep), flush=True)
    sys.stdin.readline()
    del model, sd, out
    gc.collect()
    torch.cuda.synchronize()
    if handle is not None:
        handle.close()
    return 0
