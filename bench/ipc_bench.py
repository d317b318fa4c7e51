"""ipc_bench.py - CUDA IPC on gmbd memory next to the runtime's own memory, in one run.

How to run: `tests/gpu/torch_run.sh --only ipc_bench` on the GPU machine (it
builds the shim and starts gmbd with --pool-keep 0), or by hand under the shim:

    GMB_SOCKET=/tmp/gmbd.sock LD_PRELOAD=build-gpu/libgmb_preload.so GMB_LIB=build-gpu/libgmb.so \\
    PYTHONPATH=client/python:tests/gpu python3 bench/ipc_bench.py [--opens 20] [--reps 5] [--json F]

Two processes, both under the shim: this one (the sender) and a receiver it
spawns as torch.multiprocessing does. The baseline is measured in the same
run, on the same GPU, by the same two processes:

(i)  open + close of a 1 GiB handle. The sender makes two 1 GiB buffers with
     the process's cudaMalloc through ctypes (the shim's): one inside a gmbd
     region (gmbd memory), one outside (the runtime's cudaMalloc), and takes
     each one's handle with cudaIpcGetMemHandle. The receiver opens and closes
     each (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess, then
     cudaIpcCloseMemHandle) once to warm up and to check that it maps the
     sender's bytes, then --opens times, the two kinds alternating. Median of
     each. Goal: gmbd within 1.5x of the runtime.
(ii) a 16 GiB weight sync (--sync-gib), (a) as 16 buckets of 1 GiB, (b) as bf16
     tensors of 2-100 MiB (tests/gpu/torch_ipc_common.py's layers), made once in gmbd
     memory (a region with a MemPool) and once in plain PyTorch memory. One
     sync: the sender serializes the list with ForkingPickler
     (torch.multiprocessing's reduce_tensor, so cudaIpcGetMemHandle), sends
     the bytes, the receiver deserializes them (cudaIpcOpenMemHandle), copies
     every tensor into its own weights (plain memory), drops what it received
     and answers. Median of --reps after one warm-up, the kinds alternating;
     checksums compared after one more sync of each kind. Goal: gmbd within
     1.1x.

Prints a table (gmbd, baseline, gmbd / baseline, and "goal met" or "MISS"
per row; a goal is never a failure), then "RESULT: PASS - figures" when
every part ran and every byte arrived, else "RESULT: FAIL - why".
"""

import argparse
import ctypes
import gc
import json
import os
import sys
import time
import traceback
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_void_p

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))  # torch_ipc_common, torch_common

from torch_ipc_common import (GiB, answer, ask, checksums, deserialize, make_weights,  # noqa: E402
                              median, serialize, weight_spec)

SYNC_GIB = 16
BUCKETS = 16
GOAL_OPEN = 1.5
GOAL_SYNC = 1.1
PATTERN = {"gmbd": 0x5A, "plain": 0xA5}
LAZY_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess, as PyTorch opens
D2H = 2  # cudaMemcpyDeviceToHost


def log(*args):
    print(*args, flush=True)


class IpcHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


class Runtime:
    """The process's CUDA runtime calls, looked up in its global scope, where
    the preloaded shim comes first: its cudaMalloc and cudaIpc* serve gmbd
    memory and gmbd's handles and hand everything else to libcudart."""

    PROTOS = {
        "cudaMalloc": [POINTER(c_void_p), c_size_t],
        "cudaFree": [c_void_p],
        "cudaMemset": [c_void_p, c_int, c_size_t],
        "cudaMemcpy": [c_void_p, c_void_p, c_size_t, c_int],
        "cudaDeviceSynchronize": [],
        "cudaIpcGetMemHandle": [POINTER(IpcHandle), c_void_p],
        "cudaIpcOpenMemHandle": [POINTER(c_void_p), IpcHandle, c_uint],
        "cudaIpcCloseMemHandle": [c_void_p],
    }

    def __init__(self):
        lib = ctypes.CDLL(None)
        for name, argtypes in self.PROTOS.items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise RuntimeError(f"{name} is not in the process's global symbols "
                                   "(no libcudart loaded with RTLD_GLOBAL?)") from None
            f.argtypes, f.restype = argtypes, c_int
            setattr(self, name, f)
        self._err = lib.cudaGetErrorString
        self._err.argtypes, self._err.restype = [c_int], c_char_p

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUDA error {rc} ({(self._err(rc) or b'?').decode()})")

    def malloc(self, n):
        p = c_void_p()
        self.check(self.cudaMalloc(byref(p), n), f"cudaMalloc({n})")
        return p.value

    def free(self, p):
        self.check(self.cudaFree(c_void_p(p)), "cudaFree")

    def fill(self, p, byte, n):
        self.check(self.cudaMemset(c_void_p(p), byte, n), "cudaMemset")
        self.check(self.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def read(self, p, n):
        buf = ctypes.create_string_buffer(n)
        self.check(self.cudaMemcpy(buf, c_void_p(p), n, D2H), "cudaMemcpy")
        return buf.raw

    def get_handle(self, p):
        h = IpcHandle()
        self.check(self.cudaIpcGetMemHandle(byref(h), c_void_p(p)), "cudaIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), ctypes.sizeof(h))

    def open(self, handle):
        p = c_void_p()
        self.check(self.cudaIpcOpenMemHandle(byref(p), IpcHandle.from_buffer_copy(handle),
                                             LAZY_PEER_ACCESS), "cudaIpcOpenMemHandle")
        return p.value

    def close(self, p):
        self.check(self.cudaIpcCloseMemHandle(c_void_p(p)), "cudaIpcCloseMemHandle")


# The receiver (a spawned child).

def receiver_main(conn):
    try:
        import torch

        import gmb

        if not gmb.preload_active():
            raise RuntimeError("the receiver is not under libgmb_preload.so")
        torch.zeros(1, device="cuda")  # the context the runtime calls below use
        rt = Runtime()
        dst = []
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            cmd = msg[0]
            if cmd == "quit":
                conn.send(("bye",))
                return
            if cmd == "opens":
                conn.send(("opens",) + rx_opens(rt, msg[1], msg[2]))
            elif cmd == "alloc":
                dst = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for shape in msg[1]]
                torch.cuda.synchronize()
                conn.send(("ok", len(dst)))
            elif cmd == "sync":
                n = rx_sync(dst, msg[1])  # what it received went with its frame
                torch.cuda.synchronize()
                torch.cuda.ipc_collect()
                conn.send(("ok", n))
            elif cmd == "sums":
                conn.send(("sums", checksums(dst)))
            elif cmd == "free":
                dst = []
                gc.collect()
                torch.cuda.empty_cache()
                conn.send(("ok", 0))
            else:
                raise RuntimeError(f"unknown command {cmd!r}")
    except Exception as e:  # noqa: BLE001 - the sender reports it
        traceback.print_exc()
        conn.send(("error", f"receiver: {type(e).__name__}: {e}"))


def rx_opens(rt, handles, n):
    """Warm-up open of each handle (its first and last bytes checked), then n
    open + close pairs per kind, alternating; microseconds."""
    seen = {}
    for kind, h in handles.items():
        p = rt.open(h)
        want = bytes([PATTERN[kind]]) * 64
        seen[kind] = rt.read(p, 64) == want and rt.read(p + GiB - 64, 64) == want
        rt.close(p)
    times = {k: {"open": [], "close": []} for k in handles}
    kinds = list(handles)
    for i in range(n):
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter_ns()
            p = rt.open(handles[kind])
            t1 = time.perf_counter_ns()
            rt.close(p)
            t2 = time.perf_counter_ns()
            times[kind]["open"].append((t1 - t0) / 1e3)
            times[kind]["close"].append((t2 - t1) / 1e3)
    return times, seen


def rx_sync(dst, data):
    """Deserialize (the handles opened), copy into our weights; what was
    received dies with this frame (the handles closed)."""
    got = deserialize(data)
    if len(got) != len(dst):
        raise RuntimeError(f"{len(got)} tensors for {len(dst)} weights")
    for d, s in zip(dst, got):
        d.copy_(s)
    return len(got)


# The sender.

class Bench:
    def __init__(self, args):
        import torch
        import torch.multiprocessing as mp

        import gmb

        self.torch = torch
        self.gmb = gmb
        self.args = args
        if not gmb.preload_active():
            raise RuntimeError("run under LD_PRELOAD=libgmb_preload.so (see --help)")
        torch.zeros(1, device="cuda")
        self.rt = Runtime()
        self.client = gmb.default_client()
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        name = os.environ.get("GMB_CLIENT_NAME")
        os.environ["GMB_CLIENT_NAME"] = "ipc-bench-rx"
        # daemon: should the sender fail, its exit ends the receiver too.
        self.rx = ctx.Process(target=receiver_main, args=(theirs,), daemon=True)
        self.rx.start()
        if name is None:
            os.environ.pop("GMB_CLIENT_NAME")
        else:
            os.environ["GMB_CLIENT_NAME"] = name
        theirs.close()
        answer(self.conn, 180)
        self.rows = []
        self.failures = []
        self.figures = {}

    def row(self, what, unit, g, p, goal):
        ratio = g / p if p > 0 else float("inf")
        verdict = "-" if goal is None else ("goal met" if ratio <= goal else "MISS")
        self.rows.append((what, f"{g:.1f} {unit}", f"{p:.1f} {unit}", f"{ratio:.2f}x",
                          "-" if goal is None else f"<= {goal}x", verdict))
        return ratio, verdict

    def opens(self):
        """(i): one 1 GiB buffer of each kind, its handle opened and closed in the receiver."""
        rt, gmb = self.rt, self.gmb
        with gmb.region("ipcbench", "discard"):
            pg = rt.malloc(GiB)
        pp = rt.malloc(GiB)
        try:
            if not self.client.owns(pg) or self.client.owns(pp):
                raise RuntimeError("the region's cudaMalloc did not give gmbd memory, or the "
                                   "other one did")
            rt.fill(pg, PATTERN["gmbd"], GiB)
            rt.fill(pp, PATTERN["plain"], GiB)
            handles = {"gmbd": rt.get_handle(pg), "plain": rt.get_handle(pp)}
            if not handles["gmbd"].startswith(b"GMBIPC") or handles["plain"].startswith(b"GMBIPC"):
                raise RuntimeError("the handles are not gmbd's and the runtime's")
            _, times, seen = ask(self.conn, ("opens", handles, self.args.opens))
        finally:
            rt.free(pg)
            rt.free(pp)
        for kind, ok in seen.items():
            if not ok:
                self.failures.append(f"the receiver's open of the {kind} handle maps other bytes")
        med = {k: {op: median(v) for op, v in t.items()} for k, t in times.items()}
        pair = {k: median([o + c for o, c in zip(t["open"], t["close"])]) for k, t in times.items()}
        n = self.args.opens
        ratio, verdict = self.row(f"open + close of a 1 GiB handle, median of {n}", "us",
                                  pair["gmbd"], pair["plain"], GOAL_OPEN)
        self.row("  open alone", "us", med["gmbd"]["open"], med["plain"]["open"], None)
        self.row("  close alone", "us", med["gmbd"]["close"], med["plain"]["close"], None)
        self.figures["open_close_1gib"] = {"median_us": pair, "open_close_median_us": med,
                                           "samples_us": times, "ratio": ratio, "goal": GOAL_OPEN,
                                           "verdict": verdict}

    def sync(self, layout, shapes):
        """(ii) for one layout: the same shapes in gmbd memory and in plain memory."""
        torch, gmb = self.torch, self.gmb
        from torch_common import my_tags

        spec = [(f"w{i}", s) for i, s in enumerate(shapes)]
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool), gmb.region("ipcbench", "discard"):
            src = {"gmbd": list(make_weights(spec, 11).values())}
        src["plain"] = list(make_weights(spec, 12).values())
        torch.cuda.synchronize()
        total = sum(t.numel() * t.element_size() for t in src["gmbd"])
        lent = my_tags(self.client).get("ipcbench", {}).get("bytes", 0)
        if lent < total:
            raise RuntimeError(f"{layout}: the gmbd set is not in gmbd memory ({lent} bytes lent)")
        want = {k: checksums(v) for k, v in src.items()}
        ask(self.conn, ("alloc", [tuple(s) for s in shapes]))

        def once(kind):
            t0 = time.perf_counter()
            _, n = ask(self.conn, ("sync", serialize(src[kind])))
            dt = (time.perf_counter() - t0) * 1e3
            if n != len(shapes):
                raise RuntimeError(f"{layout} {kind}: {n} of {len(shapes)} tensors loaded")
            return dt

        kinds = ["gmbd", "plain"]
        for k in kinds:
            once(k)  # warm-up
        times = {k: [] for k in kinds}
        for rep in range(self.args.reps):
            for k in (kinds if rep % 2 == 0 else kinds[::-1]):
                times[k].append(once(k))
        for k in kinds:
            once(k)
            got = ask(self.conn, ("sums",))[1]
            if got != want[k]:
                self.failures.append(f"{layout}: the receiver's weights differ after a sync "
                                     f"from {k} memory")
        src.clear()  # the tensors go; the receiver let go of them already
        ask(self.conn, ("free",))
        gc.collect()
        del pool
        torch.cuda.empty_cache()
        med = {k: median(v) for k, v in times.items()}
        size = f"{total / GiB:.3g} GiB sync"
        what = {"buckets": f"{size}, {len(shapes)} buckets of {total / len(shapes) / GiB:.3g} GiB",
                "tensors": f"{size}, {len(shapes)} tensors of 2-100 MiB"}[layout]
        ratio, verdict = self.row(f"{what}, median of {self.args.reps}", "ms", med["gmbd"],
                                  med["plain"], GOAL_SYNC)
        self.figures[f"sync_{layout}"] = {"tensors": len(shapes), "bytes": total, "median_ms": med,
                                          "samples_ms": times, "ratio": ratio, "goal": GOAL_SYNC,
                                          "verdict": verdict}

    def close(self):
        try:
            if self.rx.is_alive():
                ask(self.conn, ("quit",), 60)
        finally:
            self.rx.join(60)
            if self.rx.is_alive():
                self.rx.kill()
                self.rx.join(10)

    def table(self):
        log("\n| measurement | gmbd memory | runtime memory | gmbd / runtime | goal | verdict |")
        log("|---|---|---|---|---|---|")
        for r in self.rows:
            log("| " + " | ".join(r) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opens", type=int, default=20, help="timed opens per kind (i)")
    ap.add_argument("--reps", type=int, default=5, help="timed syncs per kind and layout (ii)")
    ap.add_argument("--sync-gib", type=float, default=SYNC_GIB,
                    help=f"the weights of (ii), in {BUCKETS} buckets or in tensors (default "
                         f"{SYNC_GIB}: the goal's size)")
    ap.add_argument("--json", help="write every figure and sample here")
    args = ap.parse_args()
    bench = None
    try:
        bench = Bench(args)
        bench.opens()
        sync_bytes = int(args.sync_gib * GiB) // (BUCKETS * 2) * (BUCKETS * 2)
        bench.sync("buckets", [(sync_bytes // BUCKETS // 2,)] * BUCKETS)
        bench.sync("tensors", [shape for _, shape in weight_spec(sync_bytes)])
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        traceback.print_exc()
        if bench is not None:
            bench.table()
        print(f"RESULT: FAIL - {type(e).__name__}: {e}", flush=True)
        return 1
    finally:
        if bench is not None:
            bench.close()
    bench.table()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(bench.figures, f, indent=1)
    if bench.failures:
        print("RESULT: FAIL - " + "; ".join(bench.failures[:3]), flush=True)
        return 1
    f = bench.figures
    o, b, t = f["open_close_1gib"], f["sync_buckets"], f["sync_tensors"]
    met = sum(x["verdict"] == "goal met" for x in (o, b, t))
    print(f"RESULT: PASS - open + close of 1 GiB: gmbd {o['median_us']['gmbd']:.1f} us, runtime "
          f"{o['median_us']['plain']:.1f} us ({o['ratio']:.2f}x, {o['verdict']}); "
          f"{b['bytes'] / GiB:.3g} GiB sync as {b['tensors']} buckets: "
          f"{b['median_ms']['gmbd']:.1f} vs {b['median_ms']['plain']:.1f} ms "
          f"({b['ratio']:.2f}x, {b['verdict']}); as {t['tensors']} tensors: "
          f"{t['median_ms']['gmbd']:.1f} vs {t['median_ms']['plain']:.1f} ms ({t['ratio']:.2f}x, "
          f"{t['verdict']}); {met} of 3 goals met; every byte arrived", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
