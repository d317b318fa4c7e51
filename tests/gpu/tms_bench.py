"""torch_memory_saver and gmbd's drop-in side by side, in one run, on one GPU.

    tms_bench.py [--reps 3] [--procs 3] [--json FILE]

Builds the peer (.peer/torch_memory_saver at 4a43c97, its setup.py, into a
temporary copy) and runs the same workload in separate processes against it
and against the stand-in package (client/python-tms on gmbd, $GMB_SOCKET),
in processes of their own per implementation and mode (discard; CPU backup
with retain off; CPU backup with retain on): --procs of each in discard and
retain on, whose rows are judged against 1.0x and vary more between
processes than the goals' margins, each figure the median of those
processes (the implementations interleaved), one in retain off. Each
process makes two shapes, each in a
region of its own tag: 16 x 1 GiB tensors (tag "big"), then 2,048 x 2 MiB
tensors (tag "small"), and times each shape's allocation: the wall time of
torch.empty of its tensors in the region, the GPU synchronized before and
after, once per process, after a warm-up allocation in a tag of its own (the
process's first use of its library: gmbd's connection, the peer's init).
A region's freed blocks stay in PyTorch's cache, so a second allocation of
a shape would time the cache, not the library: one sample a process.
Then a CUDA graph captured over all tensors (preload mode), and per tag
pause(tag)/resume(tag), medians of --reps cycles after one warm-up; after
each cycle the graph is replayed and, in the backup modes, that shape's
bytes are checked.

gmbd runs in two modes: its default (a pause gives memory to the driver;
$GMB_SOCKET) and, when $GMB_SOCKET_WARM names one (tests/gpu/tms_suite.sh
starts it), a gmbd with --pool-keep unlimited (free memory kept warm). Prints
every figure and every ratio (peer / gmbd: above 1 means gmbd is faster), for
the default gmbd in discard what it spends per chunk beyond the peer on each
shape (its pause and resume less the peer's, over the chunks that each cycle
of that tag released and created, from gmbd's counters: the export, import
and fd transfer that lending costs), then the goals of each mode, default
first, each PASS or MISS with its measured value:

  default: ratio >= 1.0 for allocate, pause and resume of both shapes in
           discard and in backup with retain on; retain-off pause >= 5x;
  warm:    discard pause >= 10x on 16 x 1 GiB, >= 5x on 2,048 x 2 MiB;
           retained cycle (pause and resume) >= 0.8x (at the pinned limit).

Last "RESULT: PASS|MISS|FAIL - ...": FAIL only when a process crashed or
bytes came back wrong, MISS when a goal is missed (how many, which).
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
# (tag, name, count, bytes each), made in this order.
SHAPES = (("big", "16 x 1 GiB", 16, GiB), ("small", "2,048 x 2 MiB", 2048, 2 * MiB))
STEPS = (("allocate", "alloc_s"), ("pause", "pause_s"), ("resume", "resume_s"))
IMPLS = (("peer", "peer"), ("gmbd", "gmbd"), ("warm", "warm gmbd"))
# The modes whose rows are judged against 1.0x, where run-to-run spread decides: --procs each.
JUDGED_AT_1X = ("discard", "backup_retain_on")


def child(mode, reps):
    """One process, one mode: both shapes, timed; prints one JSON line."""
    import time

    import torch
    from torch_memory_saver import configure_subprocess  # noqa: F401 - the package under test
    from torch_memory_saver import torch_memory_saver as tms

    tms.hook_mode = "preload"
    backup = mode != "discard"
    if backup:
        tms.retain_cpu_backup = mode == "backup_retain_on"
    torch.cuda.synchronize()  # the CUDA context exists before the first timing

    def fill(tag, i):
        # big: every byte i + 1; small: i % 251 (checked on every 97th tensor)
        return i + 1 if tag == "big" else i % 251

    tensors, out = {}, {}
    with tms.region(tag="warmup", enable_cpu_backup=backup):
        w = torch.empty((2 * MiB,), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del w
    for tag, _, count, size in SHAPES:
        with tms.region(tag=tag, enable_cpu_backup=backup):
            # The allocation alone (torch.empty), then the fill, untimed.
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ts = [torch.empty((size,), dtype=torch.uint8, device="cuda") for _ in range(count)]
            torch.cuda.synchronize()
            out[tag] = {"alloc_s": time.perf_counter() - t0}
            for i, t in enumerate(ts):
                t.fill_(fill(tag, i))
            tensors[tag] = ts
    every = [t for tag, *_ in SHAPES for t in tensors[tag]]
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for t in every:
            t.add_(0)
    torch.cuda.current_stream().wait_stream(s)
    with tms.cuda_graph(g, tag="bench_graph"):
        for t in every:
            t.add_(0)  # reads and writes every tensor, keeps the bytes
    torch.cuda.synchronize()

    def counters():
        try:
            import gmb
            d = gmb.default_client().status()["devices"][0]
            return d.get("chunks_created", 0), d.get("chunks_released", 0)
        except Exception:  # the peer: no gmbd
            return 0, 0

    def intact(tag):
        ts = tensors[tag]
        if tag == "big":
            return all(int(t[:: 1 << 24].min()) == fill(tag, i) == int(t[:: 1 << 24].max())
                       for i, t in enumerate(ts))
        return all(int(t[0]) == fill(tag, i) for i, t in list(enumerate(ts))[::97])

    for tag, *_ in SHAPES:
        c0 = counters()
        pauses, resumes, ok = [], [], True
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tms.pause(tag)
            t1 = time.perf_counter()
            tms.resume(tag)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            pauses.append(t1 - t0)
            resumes.append(t2 - t1)
            g.replay()
            torch.cuda.synchronize()
            if backup:
                ok &= intact(tag)
        c1 = counters()
        out[tag].update(pause_s=statistics.median(pauses[1:]),
                        resume_s=statistics.median(resumes[1:]), bytes_ok=ok,
                        created_per_cycle=(c1[0] - c0[0]) / (reps + 1),
                        released_per_cycle=(c1[1] - c0[1]) / (reps + 1))
    print("BENCH " + json.dumps({"shapes": out, "tms": tms.__class__.__module__}), flush=True)


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


def merged(runs):
    """Processes of one implementation and mode as one: per shape the median of each figure
    across them, bytes right only if right in all; None if any failed."""
    if not runs or any(r is None for r in runs):
        return None
    out = {"shapes": {}, "tms": runs[0]["tms"], "procs": len(runs)}
    for tag in runs[0]["shapes"]:
        shapes = [r["shapes"][tag] for r in runs]
        one = {k: statistics.median(s[k] for s in shapes) for k in shapes[0] if k != "bytes_ok"}
        one["bytes_ok"] = all(s["bytes_ok"] for s in shapes)
        out["shapes"][tag] = one
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=3,
                    help="processes per implementation in the modes judged at 1.0x (discard, "
                         "retain on); each figure is their median")
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
        runs = {}
        for mode in MODES:
            # Interleaved, so that a slow minute of the machine lands on every side.
            for _ in range(a.procs if mode in JUDGED_AT_1X else 1):
                runs.setdefault(("peer", mode), []).append(
                    run_child(py, "peer", mode, a.reps, peer_dir,
                              os.path.join(peer_dir, peer_so[0]), {}))
                runs.setdefault(("gmbd", mode), []).append(
                    run_child(py, "gmbd", mode, a.reps, gmb_pp, os.environ["GMB_PRELOAD_LIB"], {}))
                if warm:
                    runs.setdefault(("warm", mode), []).append(
                        run_child(py, "gmbd warm", mode, a.reps, gmb_pp,
                                  os.environ["GMB_PRELOAD_LIB"], {"GMB_SOCKET": warm}))
        res = {key: merged(v) for key, v in runs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(res, a, bool(warm))


def ratio(p, g, key):
    """peer / gmbd of one figure (above 1: gmbd faster); nan when either is missing."""
    if not p or not g or not g.get(key, 0) > 0:
        return float("nan")
    return p[key] / g[key]


def shape_of(res, impl, mode, tag):
    """One shape's figures of one process, or None when the process failed."""
    r = res.get((impl, mode))
    return r["shapes"][tag] if r else None


def fmt_ms(r, key):
    return f"{r[key] * 1e3:>8.1f}ms" if r else f"{'-':>10}"


def fmt_x(x):
    return f"{x:>6.2f}" if x == x else f"{'-':>6}"  # x != x: nan


def add_goal(goals, mode, what, x, goal, value=None):
    """Goal "what: >= goal x the peer", met when x >= goal; x nan (not measured): neither."""
    ok = None if x != x else x >= goal
    want = f"{goal:.1f}" if goal < 2 else f"{goal:g}"
    goals.append({"mode": mode, "what": what, "goal": f"{what}: >= {want}x the peer",
                  "measured": "-" if ok is None else value or f"{x:.2f}x", "ok": ok})


def report(res, a, warm):
    """The table, the per-chunk costs, the goals by mode, the verdict."""
    impls = [(k, n) for k, n in IMPLS if k != "warm" or warm]
    print("\ngmbd: its default (a pause gives memory to the driver); warm: gmbd --pool-keep "
          "unlimited; ratio = peer / gmbd (above 1: gmbd faster); allocate: torch.empty of the "
          f"shape once per process, after a warm-up allocation; discard and retain on: each "
          f"figure the median of {a.procs} processes")
    hdr = f"{'shape':<14} {'mode':<18} {'':>9} {'peer':>10} {'gmbd':>10} {'ratio':>6}"
    if warm:
        hdr += f" {'warm':>10} {'ratio':>6}"
    print(hdr + "  bytes ok (" + "/".join(k for k, _ in impls) + ")")
    fails, rows = [], {}
    for mode in MODES:
        for k, name in impls:
            if res.get((k, mode)) is None:
                fails.append(f"{mode}: {name} run failed")
    for tag, shape, *_ in SHAPES:
        for mode in MODES:
            p, g = shape_of(res, "peer", mode, tag), shape_of(res, "gmbd", mode, tag)
            w = shape_of(res, "warm", mode, tag)
            row = rows[f"{shape} / {mode}"] = {"peer": p, "gmbd": g}
            if warm:
                row["warm"] = w
            for step, key in STEPS:
                row[f"{step}_ratio"] = ratio(p, g, key)
                if warm:
                    row[f"warm_{step}_ratio"] = ratio(p, w, key)
                first = step == STEPS[0][0]
                line = (f"{shape if mode == MODES[0] and first else '':<14} "
                        f"{mode if first else '':<18} {step:>9} {fmt_ms(p, key)} "
                        f"{fmt_ms(g, key)} {fmt_x(ratio(p, g, key))}")
                if warm:
                    line += f" {fmt_ms(w, key)} {fmt_x(ratio(p, w, key))}"
                if first:
                    line += "  " + "/".join(str(r["bytes_ok"]) if r else "-" for r in
                                            (shape_of(res, k, mode, tag) for k, _ in impls))
                print(line)
            for k, name in impls[1:]:
                r = shape_of(res, k, mode, tag)
                if r and not r["bytes_ok"]:
                    fails.append(f"{shape}, {mode}: {name} lost bytes")

    print("\ndiscard, gmbd's default, per chunk beyond the peer:")
    for tag, shape, *_ in SHAPES:
        p, g = shape_of(res, "peer", "discard", tag), shape_of(res, "gmbd", "discard", tag)
        if not p or not g:
            continue
        rel, cre = g["released_per_cycle"], g["created_per_cycle"]
        extra_p = (g["pause_s"] - p["pause_s"]) / max(rel, 1) * 1e6
        extra_r = (g["resume_s"] - p["resume_s"]) / max(cre, 1) * 1e6
        print(f"  {shape}: pause {extra_p:+.1f} us over {rel:.0f} chunks released, resume "
              f"{extra_r:+.1f} us over {cre:.0f} chunks created per cycle")
        rows[f"{shape} / discard"].update(extra_pause_us_per_chunk=extra_p,
                                         extra_resume_us_per_chunk=extra_r)

    goals = []
    for mode in MODES:  # default: every row of discard and retain on, retain-off pause
        for tag, shape, *_ in SHAPES:
            row = rows[f"{shape} / {mode}"]
            if mode == "backup_retain_off":
                add_goal(goals, "default", f"pause, {mode}, {shape}", row["pause_ratio"], 5.0)
                continue
            for step, key in STEPS:
                add_goal(goals, "default", f"{step}, {mode}, {shape}", row[f"{step}_ratio"], 1.0)
    for tag, shape, *_ in SHAPES:  # warm
        row = rows[f"{shape} / discard"]
        want = 10.0 if tag == "big" else 5.0
        add_goal(goals, "warm", f"pause, discard, {shape}",
                 row.get("warm_pause_ratio", float("nan")), want)
    for tag, shape, *_ in SHAPES:
        row = rows[f"{shape} / backup_retain_on"]
        rp = row.get("warm_pause_ratio", float("nan"))
        rr = row.get("warm_resume_ratio", float("nan"))
        # At the pinned copy limit on both sides: 0.8x leaves room for noise.
        add_goal(goals, "warm", f"retained cycle (pause, resume), {shape}",
                 min(rp, rr) if rp == rp and rr == rr else float("nan"), 0.8,
                 f"{rp:.2f}x, {rr:.2f}x")

    print(f"\ngoals, by mode (ratio = peer / gmbd):\n{'mode':<8} {'goal':<66} "
          f"{'measured':<12} result")
    for gl in goals:
        verdict = {True: "PASS", False: "MISS", None: "not measured"}[gl["ok"]]
        print(f"{gl['mode']:<8} {gl['goal']:<66} {gl['measured']:<12} {verdict}")

    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "goals": goals}, f, indent=1)

    per_mode = []
    for mode in ("default", "warm"):
        mine = [gl for gl in goals if gl["mode"] == mode]
        measured = [gl for gl in mine if gl["ok"] is not None]
        if not measured:
            why = "no $GMB_SOCKET_WARM" if mode == "warm" and not warm else "runs failed"
            per_mode.append(f"{mode} not measured ({why})")
            continue
        met = sum(gl["ok"] for gl in measured)
        per_mode.append(f"{mode} {met} of {len(measured)} goals met"
                        + (f", {len(mine) - len(measured)} not measured"
                           if len(measured) < len(mine) else ""))
    summary = "; ".join(per_mode)
    missed = [gl for gl in goals if gl["ok"] is False]
    if fails:
        print(f"RESULT: FAIL - {'; '.join(fails)}; {summary}")
        return 1
    if missed:
        which = "; ".join(f"{gl['mode']} {gl['what']} {gl['measured']}" for gl in missed)
        measured = sum(gl["ok"] is not None for gl in goals)
        print(f"RESULT: MISS - {len(missed)} of {measured} goals missed: {which}; {summary}")
        return 0
    print(f"RESULT: PASS - {summary} (peer / gmbd, 16 x 1 GiB and 2,048 x 2 MiB in a tag each, "
          "graph over them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
