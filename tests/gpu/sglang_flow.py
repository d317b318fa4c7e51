"""An SGLang-like engine on gmbd through the torch_memory_saver stand-in.

    sglang_flow.py [--rounds 10] [--weights-gib 2] [--kv-gib 4]

The parent starts the engine's worker process inside configure_subprocess()
(as SGLang starts its scheduler), and a second process that does not use
gmbd at all (no preload shim, plain torch.empty). The worker imports
torch_memory_saver (the stand-in package), puts weights (CPU backup),
kv_cache and a captured decode graph in their tags, and per round:

  release_memory_occupation: pause kv_cache, weights, cuda_graph, and only
    then torch.cuda.synchronize() (so pause must drain the device itself);
  the other process allocates most of the freed memory with torch.empty,
    writes it, frees it;
  resume_memory_occupation: resume cuda_graph, weights, kv_cache; the KV
    cache is refilled (its bytes are not kept), the graph replayed.

The output must be bit-exact with the first replay after each round, the
addresses unchanged, and NVML's used memory must drop by at least 90% of the
paused bytes when the pauses return. Prints "RESULT: PASS|FAIL - detail".
"""

import argparse
import multiprocessing as mp
import sys
import time
import traceback

GiB = 1 << 30
DIM = 8192


def _kv_fill(kv, torch):
    # Deterministic: the same bytes after every resume.
    kv.copy_(torch.arange(kv.numel(), device="cuda", dtype=torch.int64).remainder(977)
             .to(kv.dtype).view_as(kv) / 977)


def worker(conn, weights_gib, kv_gib):
    try:
        import torch
        from torch_memory_saver import torch_memory_saver as tms

        tms.hook_mode = "preload"
        torch.manual_seed(0)
        n_w = max(1, int(weights_gib * GiB) // (DIM * DIM * 2))
        with tms.region(tag="weights", enable_cpu_backup=True):
            weights = [torch.randn(DIM, DIM, device="cuda", dtype=torch.bfloat16) / DIM ** 0.5
                       for _ in range(n_w)]
        with tms.region(tag="kv_cache"):
            kv = torch.empty(int(kv_gib * GiB) // (DIM * 2), DIM, device="cuda",
                             dtype=torch.bfloat16)
        _kv_fill(kv, torch)
        static_in = torch.randn(64, DIM, device="cuda", dtype=torch.bfloat16)

        def step():
            x = static_in
            for w in weights:
                x = torch.tanh(x @ w)
            scratch = torch.ones(GiB // 4, device="cuda", dtype=torch.float32)  # graph pool
            return x + kv[-64:] + (scratch[:64 * DIM].view(64, DIM) * x.float().mean()).to(x.dtype)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with tms.cuda_graph(graph, tag="cuda_graph"):
            out = step()
        graph.replay()
        torch.cuda.synchronize()
        ref = out.clone()
        addrs = [w.data_ptr() for w in weights] + [kv.data_ptr(), out.data_ptr()]
        conn.send(("ready", {"weights": n_w * DIM * DIM * 2, "kv": kv.numel() * 2}))
        while True:
            cmd = conn.recv()
            if cmd == "stop":
                break
            if cmd == "release":
                graph.replay()  # work in flight when the pauses start
                before = torch.cuda.device_memory_used(0)
                t0 = time.monotonic()
                for tag in ("kv_cache", "weights", "cuda_graph"):
                    tms.pause(tag)
                pause_s = time.monotonic() - t0
                after = torch.cuda.device_memory_used(0)  # at the return, before any sync
                torch.cuda.synchronize()
                conn.send(("released", {"freed": before - after, "pause_ms": pause_s * 1e3}))
            elif cmd == "resume":
                t0 = time.monotonic()
                for tag in ("cuda_graph", "weights", "kv_cache"):
                    tms.resume(tag)
                resume_s = time.monotonic() - t0
                _kv_fill(kv, torch)
                graph.replay()
                torch.cuda.synchronize()
                same = [w.data_ptr() for w in weights] + [kv.data_ptr(), out.data_ptr()]
                conn.send(("resumed", {"exact": bool(torch.equal(out, ref)), "addrs": same == addrs,
                                       "resume_ms": resume_s * 1e3}))
    except Exception:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))


def other_process(conn):
    """Not a gmbd client: plain torch.empty of what it is told, written, then freed."""
    try:
        import torch

        torch.empty(1, device="cuda")
        while True:
            want = conn.recv()
            if want is None:
                break
            held, got = [], 0
            while got + GiB <= want:
                t = torch.empty(GiB, dtype=torch.uint8, device="cuda")
                t.fill_(0x5A)
                held.append(t)
                got += GiB
            torch.cuda.synchronize()
            del held
            torch.cuda.empty_cache()
            conn.send(got)
    except Exception:  # noqa: BLE001
        conn.send(traceback.format_exc())


def expect(conn, what):
    kind, data = conn.recv()
    if kind != what:
        raise RuntimeError(f"worker: wanted {what}, got {kind}: {data}")
    return data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--weights-gib", type=float, default=2)
    ap.add_argument("--kv-gib", type=float, default=4)
    a = ap.parse_args()
    from torch_memory_saver import configure_subprocess

    ctx = mp.get_context("spawn")
    other_end, other = ctx.Pipe()
    hog = ctx.Process(target=other_process, args=(other_end,), daemon=True)
    hog.start()  # outside configure_subprocess: no shim, no gmbd
    wend, w = ctx.Pipe()
    with configure_subprocess():
        eng = ctx.Process(target=worker, args=(wend, a.weights_gib, a.kv_gib), daemon=True)
        eng.start()
    problems, pauses, resumes, freed = [], [], [], []
    try:
        sizes = expect(w, "ready")
        paused = sizes["weights"] + sizes["kv"]
        for r in range(a.rounds):
            w.send("release")
            rel = expect(w, "released")
            pauses.append(rel["pause_ms"])
            freed.append(rel["freed"])
            if rel["freed"] < 0.9 * paused:
                problems.append(f"round {r}: NVML dropped {rel['freed'] / GiB:.2f} GiB at the "
                                f"pauses' return, want >= 90% of {paused / GiB:.2f} GiB")
            other.send(int(rel["freed"] * 0.9))
            got = other.recv()
            if not isinstance(got, int):
                raise RuntimeError(f"the other process failed: {got}")
            if got < 0.8 * rel["freed"] - GiB:
                problems.append(f"round {r}: the other process got {got / GiB:.1f} GiB")
            w.send("resume")
            res = expect(w, "resumed")
            resumes.append(res["resume_ms"])
            if not res["exact"]:
                problems.append(f"round {r}: output differs from the first replay")
            if not res["addrs"]:
                problems.append(f"round {r}: an address moved")
            print(f"round {r}: pause {rel['pause_ms']:.1f} ms, freed {rel['freed'] / GiB:.2f} GiB, "
                  f"other process {got / GiB:.0f} GiB, resume {res['resume_ms']:.1f} ms, "
                  f"exact {res['exact']}", flush=True)
        w.send("stop")
    except Exception as e:  # noqa: BLE001
        problems.append(str(e))
    finally:
        other.send(None)
        eng.join(60)
        hog.join(60)
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
    detail = (f"{len(resumes)}/{a.rounds} rounds of release (kv_cache, weights, cuda_graph) / "
              f"another process / resume; pause median {med(pauses):.1f} ms, resume "
              f"{med(resumes):.1f} ms")
    if problems or len(resumes) != a.rounds:
        print("\n".join(problems))
        print(f"RESULT: FAIL - {detail}; {problems[0] if problems else 'incomplete'}")
        return 1
    print(f"RESULT: PASS - {detail}; outputs bit-exact, NVML freed >= 90% at each return")
    return 0


if __name__ == "__main__":
    sys.exit(main())
