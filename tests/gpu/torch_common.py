"""Shared parts of the PyTorch GPU tests (tests/gpu/torch_*.py).

A small decoder-only transformer with a KV cache, the three ways of putting
its memory into gmbd tags (preload shim, pluggable allocator, the
torch_memory_saver drop-in), and helpers for status, timing and results.
Each test script prints one line "RESULT: PASS - detail" or "RESULT: FAIL -
detail" last (tests/gpu/torch_run.sh and run.sh read it) and exits 0 on PASS.
"""

import contextlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gmb

# cuDNN attention (PyTorch 2.11's first choice on an H200) gives different last
# bits for the same decode inputs from call to call (graph_probe.py), so no
# scenario could compare a replay bit for bit; flash and math attention are
# deterministic for these shapes.
torch.backends.cuda.enable_cudnn_sdp(False)

MiB = 1 << 20
GiB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))


def log(*args):
    print(*args, flush=True)


def result(ok, detail):
    """The last line of a test; the exit status follows it."""
    log(f"RESULT: {'PASS' if ok else 'FAIL'} - {detail}")
    sys.exit(0 if ok else 1)


def ms(t0, t1):
    return (t1 - t0) * 1e3


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


# The model.

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def _split(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        return [y.view(shape).transpose(1, 2) for y in (q, k, v)]

    def _out(self, x, o):
        b, t, d = x.shape
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        """Training: causal attention over x itself."""
        q, k, v = self._split(x)
        return self._out(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def cached(self, x, kv_k, kv_v, start):
        """Inference: write x's keys/values at start.. into the cache, attend over 0..end."""
        q, k, v = self._split(x)
        t = x.shape[1]
        kv_k[:, :, start:start + t].copy_(k)
        kv_v[:, :, start:start + t].copy_(v)
        keys, vals = kv_k[:, :, :start + t], kv_v[:, :, :start + t]
        o = F.scaled_dot_product_attention(q, keys, vals, is_causal=t > 1)
        return self._out(x, o)


class TinyLM(nn.Module):
    def __init__(self, vocab=8192, d=1024, heads=16, layers=4):
        super().__init__()
        self.vocab, self.d, self.heads, self.layers = vocab, d, heads, layers
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def kv_cache(self, batch, max_seq, dtype=torch.bfloat16):
        shape = (self.layers, batch, self.heads, max_seq, self.d // self.heads)
        return (torch.empty(shape, dtype=dtype, device="cuda"),
                torch.empty(shape, dtype=dtype, device="cuda"))

    def _cached(self, tokens, kv_k, kv_v, start):
        x = self.emb(tokens)
        for i, blk in enumerate(self.blocks):
            x = blk.cached(x, kv_k[i], kv_v[i], start)
        return self.head(self.ln_f(x[:, -1]))

    def step(self, prompt, kv_k, kv_v):
        """Prefill ``prompt`` into the KV cache, then decode one token from it.

        Everything the decode reads from the cache was written by this step,
        so a graph of it replays bit for bit after the cache was discarded.
        """
        nxt = self._cached(prompt, kv_k, kv_v, 0).argmax(-1, keepdim=True)
        return self._cached(nxt, kv_k, kv_v, prompt.shape[1])

    def loss(self, tokens):
        x = self.emb(tokens[:, :-1])
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), tokens[:, 1:].reshape(-1))


def new_model(dtype=torch.bfloat16, **kw):
    """The same weights in every process: seeded on the CPU, then moved."""
    torch.manual_seed(0)
    return TinyLM(**kw).to(device="cuda", dtype=dtype)


def prompt_tokens(batch, length, vocab=8192):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, length), generator=g).cuda()


def capture(fn, graph_ctx):
    """Warm ``fn`` up on a side stream, then capture it inside ``graph_ctx(graph)``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with graph_ctx(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def bits_equal(a, b):
    """Bit-for-bit equality (NaN == NaN, -0 != +0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ia = a.contiguous().view(torch.uint8)
    ib = b.contiguous().view(torch.uint8)
    return bool(torch.equal(ia, ib))


def params_checksum(tensors):
    """One float64 per call: the sum of every tensor, computed on the GPU."""
    with torch.no_grad():
        return float(sum(t.detach().double().sum() for t in tensors).item())


# Putting memory into gmbd tags, three ways.

class Hooks:
    """``region(tag, mode)``, ``pause()``, ``resume()`` for one integration.

    preload: libgmb_preload.so routes cudaMalloc inside gmb.region; a
             torch.cuda.MemPool per tag keeps the caching allocator from mixing
             a tag's blocks with other memory.
    torch:   the same pools, made with CUDAPluggableAllocator over
             gmb_torch_malloc / gmb_torch_free (no preload).
    tms:     gmb.torch_memory_saver, as torch_memory_saver users call it.
    """

    def __init__(self, mode):
        self.mode = mode
        self.client = gmb.default_client()
        self._pools = {}
        self._alloc = None
        if mode == "preload" and not gmb.preload_active():
            raise RuntimeError("mode preload: libgmb_preload.so is not in LD_PRELOAD")
        if mode == "torch":
            from torch.cuda.memory import CUDAPluggableAllocator

            self._alloc = CUDAPluggableAllocator(gmb.library_path(), "gmb_torch_malloc",
                                                 "gmb_torch_free")
        if mode == "tms":
            from gmb.torch_memory_saver import torch_memory_saver

            self.saver = torch_memory_saver

    def _pool(self, tag):
        if tag not in self._pools:
            self._pools[tag] = (torch.cuda.MemPool(self._alloc.allocator()) if self._alloc
                                else torch.cuda.MemPool())
        return self._pools[tag]

    @contextlib.contextmanager
    def region(self, tag, mode):
        if self.mode == "tms":
            with self.saver.region(tag, enable_cpu_backup=(mode == "preserve")):
                yield
            return
        with torch.cuda.use_mem_pool(self._pool(tag)), gmb.region(tag, mode):
            yield

    def pause(self, tag=None):
        (self.saver if self.mode == "tms" else self.client).pause(tag)

    def resume(self, tag=None):
        (self.saver if self.mode == "tms" else self.client).resume(tag)


# gmbd's view.

def my_tags(client):
    """{tag: dict} of this process's default client."""
    for c in client.status()["clients"]:
        if c["id"] == client.id:
            return {t["name"]: t for t in c["tags"]}
    return {}


def device0(client):
    return client.status()["devices"][0]


def nvidia_smi_used_mib():
    """Device 0's used memory as nvidia-smi sees it (no CUDA context needed), or -1."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return -1


def run_hog(name, slack=GiB, extra_env=None):
    """torch_hog.py in a child with the preload shim and GMB_DEFAULT_TAG: its report dict."""
    env = dict(os.environ, GMB_DEFAULT_TAG="hog", GMB_DEFAULT_MODE="discard",
               GMB_CLIENT_NAME=name, **(extra_env or {}))
    env["LD_PRELOAD"] = gmb.preload_path()
    env["GMB_LIB"] = gmb.library_path()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, os.path.join(HERE, "torch_hog.py"), str(slack)], env=env,
                       capture_output=True, text=True, timeout=300)
    log(p.stdout.rstrip())
    if p.returncode != 0:
        log(p.stderr[-4000:])
        raise RuntimeError(f"the hog process failed with {p.returncode}")
    for line in p.stdout.splitlines():
        if line.startswith("HOG "):
            rep = json.loads(line[4:])
            rep["wall_s"] = time.monotonic() - t0
            return rep
    raise RuntimeError("the hog process printed no HOG line")
