"""torch_memory_saver and gmbd's drop-in side by side, in one run, on one GPU.

    tms_bench.py [--reps 3] [--json FILE]

Builds the peer (.peer/torch_memory_saver at 4a43c97, its setup.py, into a
temporary copy) and runs the same workload in separate processes against it
and against the stand-in package (client/python-tms on gmbd, $GMB_SOCKET):
16 x 1 GiB and 2,048 x 2 MiB tensors in one region and a CUDA graph
captured over them (preload mode), then pause/resume, medians of --reps
cycles after one warm-up, for: discard; CPU backup with retain off; CPU
backup with retain on. Bytes are checked after every resume of a backup
mode and the graph replayed. gmbd runs twice: with its default (a pause
gives memory to the driver; $GMB_SOCKET) and, when $GMB_SOCKET_WARM names
one (tests/gpu/tms_suite.sh starts it), on a gmbd with --pool-keep
unlimited (free memory kept warm). For the default gmbd it also prints
what it spends per chunk beyond the peer (its pause and resume less the
peer's, over the chunks that each cycle released and created, from gmbd's
counters): the export, import and fd transfer that lending costs. Prints
every figure and every ratio (peer / gmbd: above 1 means gmbd is faster),
then
"RESULT: PASS|MISS|FAIL - ...": MISS when gmbd's pause with retain off is
less than 5x the peer's or a retained cycle is over 1.25x the peer's.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

GiB, MiB = 1 << 30, 1 << 20
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODES = ("discard", "backup_retain_off", "backup_retain_on")


def child(mode, reps):
    """One process, one mode: the workload, timed; prints one JSON line."""
    import time

    import torch
    from torch_memory_saver import configure_subprocess  # noqa: F401 - the package under test
    from torch_memory_saver import torch_memory_saver as tms

    tms.hook_mode = "preload"
    backup = mode != "discard"
    if backup:
        tms.retain_cpu_backup = mode == "backup_retain_on"
    with tms.region(tag="bench", enable_cpu_backup=backup):
        big = [torch.full((GiB,), i + 1, dtype=torch.uint8, device="cuda") for i in range(16)]
        small = [torch.full((2 * MiB,), i % 251, dtype=torch.uint8, device="cuda")
                 for i in range(2048)]
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for t in big + small:
            t.add_(0)
    torch.cuda.current_stream().wait_stream(s)
    with tms.cuda_graph(g, tag="bench_graph"):
        for t in big + small:
            t.add_(0)  # reads and writes every tensor, keeps the bytes
    torch.cuda.synchronize()

    def counters():
        try:
            import gmb
            d = gmb.default_client().status()["devices"][0]
            return d.get("chunks_created", 0), d.get("chunks_released", 0)
        except Exception:  # the peer: no gmbd
            return 0, 0

    c0 = counters()
    pauses, resumes, ok = [], [], True
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tms.pause()
        t1 = time.perf_counter()
        tms.resume()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        pauses.append(t1 - t0)
        resumes.append(t2 - t1)
        g.replay()
        torch.cuda.synchronize()
        if backup:
            ok &= all(int(t[:: 1 << 24].min()) == i + 1 == int(t[:: 1 << 24].max())
                      for i, t in enumerate(big))
            ok &= all(int(t[0]) == i % 251 for i, t in list(enumerate(small))[::97])
    c1 = counters()
    print("BENCH " + json.dumps({"pause_s": statistics.median(pauses[1:]),
                                 "resume_s": statistics.median(resumes[1:]), "bytes_ok": ok,
                                 "created_per_cycle": (c1[0] - c0[0]) / (reps + 1),
                                 "released_per_cycle": (c1[1] - c0[1]) / (reps + 1),
                                 "tms": tms.__class__.__module__}), flush=True)


def build_peer(py, tmp):
    """The peer's two libraries, built by its setup.py in a copy: (folder, log)."""
    src = os.path.join(ROOT, ".peer", "torch_memory_saver")
    dst = os.path.join(tmp, "peer")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git"))
    major = subprocess.run([py, "-c", "import torch; print(torch.version.cuda.split('.')[0])"],
                           capture_output=True, text=True).stdout.strip()
    p = subprocess.run([py, "setup.py", "build_ext", "--inplace"], cwd=dst, capture_output=True,
                       text=True, env=dict(os.environ, TMS_CUDA_MAJOR=major or "12"), timeout=600)
    return (dst if p.returncode == 0 else None), p.stdout[-3000:] + p.stderr[-3000:]


def run_child(py, impl, mode, reps, pythonpath, preload, env_extra):
    env = dict(os.environ, PYTHONPATH=pythonpath, LD_PRELOAD=preload, **env_extra)
    p = subprocess.run([py, os.path.abspath(__file__), "--child", mode, "--reps", str(reps)],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tempfile.gettempdir())
    for line in p.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    sys.stdout.write(f"---- {impl} {mode} failed (exit {p.returncode}):\n{p.stdout[-2000:]}"
                     f"\n{p.stderr[-3000:]}\n")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.reps)
        return 0
    py = sys.executable
    tmp = tempfile.mkdtemp(prefix="tmsbench.")
    try:
        peer_dir, blog = build_peer(py, tmp)
        if peer_dir is None:
            print(blog)
            print("RESULT: FAIL - the peer did not build (its setup.py; output above)")
            return 1
        peer_so = [f for f in os.listdir(peer_dir) if f.startswith("torch_memory_saver_hook_mode_preload")
                   and f.endswith(".so")]
        gmb_pp = f"{ROOT}/client/python-tms:{ROOT}/client/python"
        warm = os.environ.get("GMB_SOCKET_WARM")
        res = {}
        for mode in MODES:
            res[("peer", mode)] = run_child(py, "peer", mode, a.reps, peer_dir,
                                            os.path.join(peer_dir, peer_so[0]), {})
            res[("gmbd", mode)] = run_child(py, "gmbd", mode, a.reps, gmb_pp,
                                            os.environ["GMB_PRELOAD_LIB"], {})
            if warm:
                res[("warm", mode)] = run_child(py, "gmbd warm", mode, a.reps, gmb_pp,
                                                os.environ["GMB_PRELOAD_LIB"],
                                                {"GMB_SOCKET": warm})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(res, a, bool(warm))


def ratio(p, g, key):
    return p[key] / g[key] if g and g[key] > 0 else float("nan")


def report(res, a, warm):
    """The table, the per-chunk cost, the verdict."""
    print("\ngmbd: its default (a pause gives memory to the driver); warm: gmbd --pool-keep "
          "unlimited; ratio = peer / gmbd (above 1: gmbd faster)")
    hdr = f"{'mode':<18} {'':>7} {'peer':>10} {'gmbd':>10} {'ratio':>6}"
    if warm:
        hdr += f" {'warm':>10} {'ratio':>6}"
    print(hdr + "  bytes ok (peer/gmbd/warm)")
    misses, fails, rows = [], [], {}
    for mode in MODES:
        p, g, w = res[("peer", mode)], res[("gmbd", mode)], res.get(("warm", mode))
        if not p or not g or (warm and not w):
            fails.append(f"{mode}: {'peer' if not p else 'gmbd' if not g else 'warm gmbd'} run failed")
            continue
        rows[mode] = {"peer": p, "gmbd": g, "pause_ratio": ratio(p, g, "pause_s"),
                      "resume_ratio": ratio(p, g, "resume_s")}
        if warm:
            rows[mode].update(warm=w, warm_pause_ratio=ratio(p, w, "pause_s"),
                              warm_resume_ratio=ratio(p, w, "resume_s"))
        for what in ("pause", "resume"):
            key = what + "_s"
            line = (f"{mode if what == 'pause' else '':<18} {what:>7} {p[key] * 1e3:>8.1f}ms "
                    f"{g[key] * 1e3:>8.1f}ms {ratio(p, g, key):>6.2f}")
            if warm:
                line += f" {w[key] * 1e3:>8.1f}ms {ratio(p, w, key):>6.2f}"
            if what == "pause":
                line += f"  {p['bytes_ok']}/{g['bytes_ok']}/{w['bytes_ok'] if warm else '-'}"
            print(line)
        for name, r in (("gmbd", g), ("warm gmbd", w)):
            if r and not r["bytes_ok"]:
                fails.append(f"{mode}: {name} lost bytes")
        if mode == "backup_retain_off" and rows[mode]["pause_ratio"] < 5:
            misses.append(f"retain-off pause {rows[mode]['pause_ratio']:.2f}x the peer's (goal 5x)")
        if mode == "backup_retain_on" and (rows[mode]["pause_ratio"] < 0.8 or
                                           rows[mode]["resume_ratio"] < 0.8):
            misses.append(f"retained cycle {rows[mode]['pause_ratio']:.2f}x / "
                          f"{rows[mode]['resume_ratio']:.2f}x the peer's (goal: at the pinned limit)")
    d = rows.get("discard")
    if d:
        g, p = d["gmbd"], d["peer"]
        rel, cre = g["released_per_cycle"], g["created_per_cycle"]
        print(f"\ndiscard, gmbd's default, per chunk beyond the peer: pause "
              f"{(g['pause_s'] - p['pause_s']) / max(rel, 1) * 1e6:+.1f} us over {rel:.0f} chunks "
              f"released, resume {(g['resume_s'] - p['resume_s']) / max(cre, 1) * 1e6:+.1f} us over "
              f"{cre:.0f} chunks created per cycle")
        d.update(extra_pause_us_per_chunk=(g["pause_s"] - p["pause_s"]) / max(rel, 1) * 1e6,
                 extra_resume_us_per_chunk=(g["resume_s"] - p["resume_s"]) / max(cre, 1) * 1e6)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({m: r for m, r in rows.items()}, f, indent=1)
    summary = "; ".join(f"{m} pause x{r['pause_ratio']:.2f} resume x{r['resume_ratio']:.2f}"
                        + (f" (warm x{r['warm_pause_ratio']:.2f} / x{r['warm_resume_ratio']:.2f})"
                           if "warm" in r else "")
                        for m, r in rows.items())
    if fails:
        print(f"RESULT: FAIL - {'; '.join(fails)}; {summary}")
        return 1
    if misses:
        print(f"RESULT: MISS - {'; '.join(misses)}; {summary} (peer/gmbd)")
        return 0
    print(f"RESULT: PASS - {summary} (peer/gmbd, 16 x 1 GiB + 2048 x 2 MiB, graph over them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
