"""object_bench.py - a named object's open, and kernels reading its read-only mapping.

How to run: `tests/gpu/torch_run.sh --only objects_bench` on the GPU machine
(it starts gmbd with --pool-keep 0), or by hand:

    GMB_SOCKET=/tmp/gmbd.sock GMB_LIB=build-gpu/libgmb.so PYTHONPATH=client/python:tests/gpu \\
    python3 bench/object_bench.py --gmbctl build-gpu/gmbctl [--gib 16] [--opens 10] [--json F]

One process, a gmbd client (gmb.default_client(), no preload shim), in one
run on one GPU:

(i)  open + close of a 16 GiB version (--gib): the process allocates it from
     gmbd (Client.malloc_peers), fills it, publishes it (Client.object_publish)
     and lets go of the publisher's own open, so that every open maps the
     whole version read-only and every close unmaps it. Median of --opens
     opens and of their closes (Client.object_open / object_close).
(ii) bandwidth-bound kernels over the same 4 GiB of bf16 (--kernel-gib) in
     three kinds of memory: plain PyTorch memory (cudaMalloc through the
     caching allocator), the gmbd allocation while it is still the owner's
     (read-write, before the publish), and the version's read-only mapping
     (an open of it). Kernels: a sum (torch.sum, float32 accumulator) and an
     add into another buffer (torch.add(x, 1, out=y), y plain memory). CUDA
     events, median of --reps after a warm-up; GB/s and the ratio to plain
     memory. The bytes' checksums over the three kinds must be equal.

Prints a table, then "RESULT: PASS - figures" when every part ran and every
check held (no goal here: figures only), else "RESULT: FAIL - why". Drops
the object; ends with `gmbctl status --json` listing no object and the
driver's free memory within 64 MiB of what it was before (read in this
process, before it took anything from gmbd and after it gave everything
back).
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))

import torch  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
FREE_SLACK = 64 * MiB


def log(*args):
    print(*args, flush=True)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def gmbctl(path, *argv):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run([path, *argv], capture_output=True, text=True, timeout=60, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"gmbctl {' '.join(argv)}: exit {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()}")
    return p.stdout


def device_bytes(ptr, size, device=0):
    """A uint8 tensor viewing ``size`` bytes at ``ptr`` (no copy; the read-only flag of
    __cuda_array_interface__ is never set: torch refuses it)."""

    class _Mem:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                    "version": 3}

    return torch.as_tensor(_Mem(), device=torch.device("cuda", device))


def fill(buf):
    """A pattern every run the same: bf16 values of a seeded generator, in 1 GiB steps."""
    g = torch.Generator(device="cuda").manual_seed(5)
    step = GiB
    for off in range(0, buf.numel(), step):
        n = min(step, buf.numel() - off)
        seg = buf[off:off + n - n % 2].view(torch.bfloat16)
        seg.normal_(0.0, 1.0, generator=g)
    torch.cuda.synchronize()


class Bench:
    def __init__(self, args):
        import gmb

        self.args = args
        self.client = gmb.default_client()
        self.failures = []
        self.rows = []
        self.kn = int(args.kernel_gib * GiB) // 2  # bf16 elements
        self.dst = None

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"FAILED: {what}")
        return ok

    def kernels(self, kind, x):
        """The sum's and the add's times and GB/s over the bf16 tensor ``x``, and its bytes'
        checksum (``sum``)."""
        reps = self.args.reps
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(fn):
            fn()
            torch.cuda.synchronize()
            ts = []
            for _ in range(reps):
                start.record()
                fn()
                end.record()
                end.synchronize()
                ts.append(start.elapsed_time(end))
            return median(ts)

        # The bytes' own checksum (integers: exact whatever the reduction's order).
        total = torch.sum(x.view(torch.int16), dtype=torch.int64).item()
        sum_ms = timed(lambda: torch.sum(x, dtype=torch.float32))
        add_ms = timed(lambda: torch.add(x, 1, out=self.dst))
        nbytes = x.numel() * x.element_size()
        r = {"kind": kind, "sum_ms": sum_ms, "add_ms": add_ms,
             "sum_gbs": nbytes / sum_ms / 1e6, "add_gbs": 2 * nbytes / add_ms / 1e6, "sum": total,
             "ptr": x.data_ptr()}
        log(f"{kind:<28} sum {sum_ms:7.3f} ms ({r['sum_gbs']:7.1f} GB/s)   add {add_ms:7.3f} ms "
            f"({r['add_gbs']:7.1f} GB/s)")
        return r

    def run(self):
        a = self.args
        name = f"gmbbench.{os.getpid()}"
        size = int(a.gib * GiB)
        kbytes = self.kn * 2
        if kbytes > size:
            raise RuntimeError(f"--kernel-gib {a.kernel_gib} is more than --gib {a.gib}")
        # Warm: context, the kernels' modules, cuBLAS-free reductions; then the baseline.
        w = torch.ones(1 << 20, device="cuda", dtype=torch.bfloat16)
        torch.sum(w, dtype=torch.float32).item()
        torch.add(w, 1, out=torch.empty_like(w))
        del w
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.client.id  # noqa: B018 - connected
        free0 = torch.cuda.mem_get_info(0)[0]
        st0 = json.loads(gmbctl(a.gmbctl, "status", "--json"))
        self.expect(not st0.get("objects"), f"objects before the bench: {st0.get('objects')}")

        self.dst = torch.empty(self.kn, dtype=torch.bfloat16, device="cuda")
        plain = torch.empty(self.kn, dtype=torch.bfloat16, device="cuda")
        ptr = self.client.malloc_peers(size, 0, (), tag="object-bench")
        published = False
        try:
            owner = device_bytes(ptr, size)
            fill(owner)
            plain.copy_(owner[:kbytes].view(torch.bfloat16))
            torch.cuda.synchronize()
            res = [self.kernels("plain (cudaMalloc)", plain),
                   self.kernels("gmbd, the owner's (rw)", owner[:kbytes].view(torch.bfloat16))]
            del owner
            t0 = time.perf_counter()
            v = self.client.object_publish(name, ptr, b"object_bench")
            publish_ms = (time.perf_counter() - t0) * 1e3
            published = True
            # The publisher's own open of v: the same pointer opened again counts
            # one more; two closes let go of both, so each open below maps anew.
            p2, _, _ = self.client.object_open(name, v)
            self.expect(p2 == ptr, f"the publisher's version is at {p2:#x}, not {ptr:#x}")
            self.client.object_close(p2)
            self.client.object_close(p2)
            opens, closes = [], []
            for _ in range(a.opens + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                q, info, _ = self.client.object_open(name)
                t1 = time.perf_counter()
                self.client.object_close(q)
                t2 = time.perf_counter()
                opens.append((t1 - t0) * 1e3)
                closes.append((t2 - t1) * 1e3)
                self.expect(info["size"] >= size, f"the open maps {info['size']} bytes")
            opens, closes = opens[1:], closes[1:]
            q, info, _ = self.client.object_open(name)
            ro = device_bytes(q, info["size"])
            res.append(self.kernels("object version (read-only)", ro[:kbytes].view(torch.bfloat16)))
            del ro
            torch.cuda.synchronize()
            self.client.object_close(q)
        finally:
            if published:
                try:
                    gmbctl(a.gmbctl, "object", "drop", name)
                except RuntimeError as e:
                    self.expect(False, str(e))
            elif self.client.owns(ptr):
                self.client.free(ptr)
        sums = {r["kind"]: r["sum"] for r in res}
        self.expect(len(set(sums.values())) == 1, f"the sums differ across the kinds: {sums}")
        del plain
        self.dst = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        st = json.loads(gmbctl(a.gmbctl, "status", "--json"))
        end = time.monotonic() + 10
        while (st.get("objects") or st.get("imports")) and time.monotonic() < end:
            time.sleep(0.1)
            st = json.loads(gmbctl(a.gmbctl, "status", "--json"))
        self.expect(not st.get("objects") and not st.get("objects_total"),
                    f"objects left: {st.get('objects')}")
        self.expect(not st.get("imports"), f"imports left: {st.get('imports')}")
        end = time.monotonic() + 20
        free1 = torch.cuda.mem_get_info(0)[0]
        while abs(free1 - free0) > FREE_SLACK and time.monotonic() < end:
            time.sleep(0.2)
            free1 = torch.cuda.mem_get_info(0)[0]
        delta = (free1 - free0) / MiB
        self.expect(abs(free1 - free0) <= FREE_SLACK,
                    f"the driver's free memory is {delta:+.0f} MiB from before (allowed 64)")
        base = res[0]
        table = ["| memory | sum ms | sum GB/s | / plain | add ms | add GB/s | / plain |",
                 "|---|---|---|---|---|---|---|"]
        for r in res:
            r["sum_ratio"] = r["sum_ms"] / base["sum_ms"]
            r["add_ratio"] = r["add_ms"] / base["add_ms"]
            table.append(f"| {r['kind']} | {r['sum_ms']:.3f} | {r['sum_gbs']:.1f} | "
                         f"{r['sum_ratio']:.3f} | {r['add_ms']:.3f} | {r['add_gbs']:.1f} | "
                         f"{r['add_ratio']:.3f} |")
        log(f"\nopen of a {size / GiB:.1f} GiB version: median {median(opens):.3f} ms "
            f"(min {min(opens):.3f}, max {max(opens):.3f}) over {len(opens)}; close median "
            f"{median(closes):.3f} ms; publish {publish_ms:.1f} ms")
        log(f"kernels over {kbytes / GiB:.1f} GiB of bf16, median of {a.reps}:")
        log("\n".join(table))
        return {"gib": a.gib, "kernel_gib": a.kernel_gib, "open_ms": opens, "close_ms": closes,
                "open_median_ms": median(opens), "close_median_ms": median(closes),
                "publish_ms": publish_ms, "kernels": res, "free_delta_mib": delta}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gmbctl", required=True, help="gmbctl to run (build-gpu/gmbctl)")
    ap.add_argument("--gib", type=float, default=16, help="the version's size")
    ap.add_argument("--kernel-gib", type=float, default=4, help="bytes the kernels read")
    ap.add_argument("--opens", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    try:
        bench = Bench(args)
        rep = bench.run()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        traceback.print_exc()
        print(f"RESULT: FAIL - {type(e).__name__}: {e}", flush=True)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    if bench.failures:
        print("RESULT: FAIL - " + "; ".join(bench.failures[:3]), flush=True)
        return 1
    k = {r["kind"]: r for r in rep["kernels"]}
    ro, own = k["object version (read-only)"], k["gmbd, the owner's (rw)"]
    print(f"RESULT: PASS - open of a {rep['gib']:.0f} GiB version median "
          f"{rep['open_median_ms']:.2f} ms (close {rep['close_median_ms']:.2f} ms) over "
          f"{args.opens}; over {rep['kernel_gib']:.0f} GiB of bf16, time / plain cudaMalloc "
          f"memory: sum read-only {ro['sum_ratio']:.3f}, owner's {own['sum_ratio']:.3f} "
          f"({k['plain (cudaMalloc)']['sum_gbs']:.0f} GB/s plain); add read-only "
          f"{ro['add_ratio']:.3f}, owner's {own['add_ratio']:.3f}; sums equal; object dropped, "
          f"driver free {rep['free_delta_mib']:+.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
