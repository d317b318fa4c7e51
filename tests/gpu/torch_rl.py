"""GPU tests 3 and 4: an RL loop - a trainer and an inference engine take
turns on one GPU, switched through gmbd's control requests - and the time of
each switch next to the create-per-allocation baseline.

    torch_rl.py --gmbctl build-gpu/gmbctl --rounds 5 --label warm \
                [--baseline build-gpu/torch_baseline] [--json OUT.json] \
                [--switch] [--via api|gmbctl]

Driver (this process, no CUDA context): starts
  trainer  LD_PRELOAD shim, GMB_DEFAULT_TAG=train (preserve): every tensor
           of the process (weights, grads, AdamW state, activations, cuBLAS
           workspace) is gmbd's; trains a transformer on a fixed batch;
  infer    LD_PRELOAD shim and gmb.torch_memory_saver: weights (preserve,
           retained copies: TMS_RETAIN_CPU_BACKUP=1, as the baseline keeps
           its pinned buffers) and kv_cache (discard), a decode step
           captured as a CUDA graph;
both with GMB_CONTROL=accept, so that `gmbctl pause/resume NAME` acts at
once (each is idle, blocked on its pipe, when the driver switches). Per
round: the trainer checks its state survived, trains 3 steps; the driver
pauses the trainer and resumes the engine; the engine replays its graph
(output bit-exact against its first replay); the driver pauses the engine
and resumes the trainer. The driver acts as an RL framework's would, through
libgmb's Python API in its own process (`gmb.Client(tool=True).control()`,
`.switch()`: one request to gmbd each); `--via gmbctl` spawns `gmbctl
pause/resume/switch` instead, an operator's way (each call then adds the
cost of starting a process, which is printed alongside). After every pause gmbd's status must show the
paused side's tags paused and nothing lent to it, and nvidia-smi must show
the memory gone from the device when gmbd keeps no pool (--label cold runs
against a gmbd with --pool-keep 0, the default; warm with --pool-keep unlimited).

Then, with the workers gone and gmbd trimmed, torch_baseline (C, the
driver API) replays the same switches the way torch_memory_saver does them:
the same number of allocations and bytes per tag, cuMemRelease on pause and
cuMemCreate + map + set access on resume, preserve tags copied through
pinned buffers kept across cycles.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
GiB = 1 << 30


# Tags whose allocations a region backs up (their own mode), per side.
BACKED_UP = {"infer": ("weights",)}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# Workers: one JSON request per line on stdin, one JSON answer per line on stdout.

def serve(handlers):
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the protocol pipe
    print(json.dumps({"ready": True, "pid": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        try:
            rep = handlers[req["cmd"]](**req.get("args", {}))
        except Exception as e:  # noqa: BLE001 - the driver reports it
            import traceback

            traceback.print_exc()
            rep = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(rep), file=out, flush=True)


def trainer():
    import torch

    from torch_common import new_model, params_checksum, prompt_tokens

    model = new_model(dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batch = prompt_tokens(16, 257)
    state = {"sum": None}

    def checksum():
        tensors = list(model.parameters())
        for st in opt.state.values():
            tensors += [v for v in st.values() if torch.is_tensor(v) and v.is_cuda]
        return params_checksum(tensors)

    def train(steps):
        losses = []
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.loss(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
        state["sum"] = checksum()
        return {"losses": losses, "checksum": state["sum"]}

    def check():
        now = checksum()
        return {"checksum": now, "same": now == state["sum"]}

    serve({"train": train, "check": check})


def infer():
    import torch

    from gmb.torch_memory_saver import torch_memory_saver as saver
    from torch_common import bits_equal, capture, new_model, prompt_tokens

    with saver.region("weights", enable_cpu_backup=True):
        model = new_model().eval()
    with saver.region("kv_cache"):
        kv_k, kv_v = model.kv_cache(16, 4096)
    prompt = prompt_tokens(16, 128)
    # A plain graph: its pool stays resident (torch_graph.py pauses a graph's own
    # pool); weights and KV cache, the bulk, pause.
    with torch.no_grad():
        g, out = capture(lambda: model.step(prompt, kv_k, kv_v), torch.cuda.graph)
        g.replay()
        torch.cuda.synchronize()
        ref = out.clone()

    def replay():
        t0 = time.monotonic()
        with torch.no_grad():
            kv_k.fill_(float("nan"))  # discarded anyway: the graph must not need it
            kv_v.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
        return {"same": bits_equal(out, ref), "ms": (time.monotonic() - t0) * 1e3}

    serve({"replay": replay})


class Worker:
    def __init__(self, role, name, env):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, bufsize=1)
        self.ready = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} died (exit {self.proc.wait()})")
        rep = json.loads(line)
        if "error" in rep:
            raise RuntimeError(f"{self.name}: {rep['error']}")
        return rep

    def cmd(self, cmd, **args):
        self.proc.stdin.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def quit(self):
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass
        return self.proc.wait(60)


# The driver.

class Driver:
    def __init__(self, args):
        self.gmbctl = args.gmbctl
        self.label = args.label
        self.use_switch = args.switch
        self.via = args.via
        self.api = None
        if self.via == "api":
            import gmb

            self.api = gmb.Client(tool=True)
        self.failures = []
        self.times = {"pause_trainer": [], "resume_infer": [], "pause_infer": [],
                      "resume_trainer": []}
        self.free_checks = []

    def ctl(self, *argv):
        t0 = time.monotonic()
        p = subprocess.run([self.gmbctl, *argv], capture_output=True, text=True, timeout=120)
        dt = (time.monotonic() - t0) * 1e3
        if p.returncode != 0:
            raise RuntimeError(f"gmbctl {' '.join(argv)}: {p.stderr.strip()}")
        return p.stdout, dt

    def act(self, op, *names):
        """pause/resume NAME or switch OFF ON, by the API or gmbctl; (report, ms)."""
        if self.via == "gmbctl":
            return self.ctl(op, *names)
        t0 = time.monotonic()
        if op == "switch":
            out = self.api.switch(*names)
        else:
            out = ""
            self.api.control(names[0], op)
        return out, (time.monotonic() - t0) * 1e3

    def status(self):
        if self.api:
            return self.api.status()
        return json.loads(self.ctl("status", "--json")[0])

    def client(self, st, name):
        for c in st["clients"]:
            if c["name"] == name:
                return c
        raise RuntimeError(f"{name} is not in gmbd's status")

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"[{self.label}] FAILED: {what}")

    def switch(self, r, off, on, names):
        """gmbctl pause OFF, check its memory is gone, gmbctl resume ON."""
        if self.use_switch:
            return self.switch_one(r, off, on, names)
        before = self.status()
        off_bytes = sum(t["bytes"] for t in self.client(before, names[off])["tags"])
        smi0 = smi_used_mib()
        _, dt_pause = self.act("pause", names[off])
        time.sleep(0.2)  # gmbd releases to the driver once the handles are dropped
        st = self.status()
        smi1 = smi_used_mib()
        tags = self.client(st, names[off])["tags"]
        self.expect(all(t["state"] == "paused" for t in tags), f"round {r}: {off} not paused")
        dev = st["devices"][0]
        lent_to_off = sum(t["bytes"] for t in tags if t["state"] == "active")
        freed_mib = smi0 - smi1
        if self.label == "cold":
            ok = freed_mib * MiB >= 0.9 * off_bytes
            how = f"nvidia-smi -{freed_mib} MiB"
        else:
            ok = dev["free_bytes"] >= off_bytes
            how = f"gmbd pool holds {dev['free_bytes'] / GiB:.2f} GiB free to lend"
        self.expect(ok and lent_to_off == 0, f"round {r}: {off}'s {off_bytes / GiB:.2f} GiB not free ({how})")
        self.free_checks.append(f"{off} {off_bytes / GiB:.2f} GiB: {how}")
        _, dt_resume = self.act("resume", names[on])
        self.times[f"pause_{off}"].append(dt_pause)
        self.times[f"resume_{on}"].append(dt_resume)
        return st

    def switch_one(self, r, off, on, names):
        """switch OFF ON: one request; OFF paused, ON active after it.

        Its whole time goes to pause_OFF (resume_ON gets 0): the report's
        pause column is then the switch's.
        """
        out, dt = self.act("switch", names[off], names[on])
        st = self.status()
        off_tags = self.client(st, names[off])["tags"]
        on_tags = self.client(st, names[on])["tags"]
        self.expect(all(t["state"] == "paused" for t in off_tags), f"round {r}: {off} not paused")
        self.expect(all(t["state"] == "active" for t in on_tags), f"round {r}: {on} not active")
        handed = [ln for ln in out.splitlines() if ln.startswith("total")]
        self.free_checks.append(f"{off}->{on}: {handed[0] if handed else out.strip()}")
        self.times[f"pause_{off}"].append(dt)
        self.times[f"resume_{on}"].append(0.0)
        return st

    def run(self, rounds):
        base = dict(os.environ, GMB_CONTROL="accept", PYTHONUNBUFFERED="1")
        names = {"trainer": f"trainer-{self.label}", "infer": f"infer-{self.label}"}
        tr = Worker("trainer", names["trainer"],
                    dict(base, GMB_DEFAULT_TAG="train", GMB_DEFAULT_MODE="preserve",
                         GMB_CLIENT_NAME=names["trainer"]))
        # Retained copies, as the baseline's pinned buffers kept across cycles
        # (torch_memory_saver's default, retain off, re-makes them each pause).
        inf = Worker("infer", names["infer"], dict(base, GMB_CLIENT_NAME=names["infer"],
                                                   TMS_RETAIN_CPU_BACKUP="1"))
        try:
            first = tr.cmd("train", steps=2)
            losses = list(first["losses"])
            self.act("pause", names["infer"])
            for r in range(rounds):
                if r:
                    chk = tr.cmd("check")
                    self.expect(chk.get("same") is True, f"round {r}: trainer state changed: {chk}")
                rep = tr.cmd("train", steps=3)
                self.expect("error" not in rep, f"round {r}: trainer: {rep.get('error')}")
                losses += rep.get("losses", [])
                self.switch(r, "trainer", "infer", names)
                rep = inf.cmd("replay")
                self.expect(rep.get("same") is True, f"round {r}: inference output differs: {rep}")
                self.switch(r, "infer", "trainer", names)
            self.expect(all(x == x for x in losses) and losses[-1] < losses[0],
                        f"trainer did not learn: {losses}")
            spec = self.spec(self.status(), names)
        finally:
            tr.quit()
            inf.quit()
        return losses, spec

    def spec(self, st, names):
        """Per tag of each side: mode, allocations, bytes (for the baseline). A tag
        whose allocations are backed up by their region (the engine's weights:
        torch_memory_saver's enable_cpu_backup) is listed by gmbd in its own
        mode, discard; the baseline copies it, as the engine's pauses do."""
        lines = []
        for side, key in (("A", "trainer"), ("B", "infer")):
            for t in self.client(st, names[key])["tags"]:
                mode = "preserve" if t["name"] in BACKED_UP.get(key, ()) else t["mode"]
                lines.append(f"{side} {mode} {t['allocations']} {t['bytes']}")
        return lines


def smi_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return -1


def run_baseline(binary, spec, rounds, gmbctl):
    subprocess.run([gmbctl, "trim"], capture_output=True, timeout=120)
    path = f"/tmp/gmb-rl-spec-{os.getpid()}.txt"
    with open(path, "w") as f:
        f.write("\n".join(spec) + "\n")
    p = subprocess.run([binary, path, str(rounds)], capture_output=True, text=True, timeout=300)
    log(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"torch_baseline failed ({p.returncode})")
    for line in p.stdout.splitlines():
        if line.startswith("BASELINE median "):
            return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[2:])}
    raise RuntimeError("torch_baseline printed no median line")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def report(drv, losses, base, overhead):
    t = {k: median(v) for k, v in drv.times.items()}
    rows = [("trainer -> inference", t["pause_trainer"], t["resume_infer"],
             base and (base["pause_A"], base["resume_B"])),
            ("inference -> trainer", t["pause_infer"], t["resume_trainer"],
             base and (base["pause_B"], base["resume_A"]))]
    how = ("gmbctl wall times" if drv.via == "gmbctl" else
           "the driver's API calls, in its process")
    log(f"\n[{drv.label}] switch times, median of {len(drv.times['pause_trainer'])} "
        f"({how}; a gmbctl call alone costs {overhead:.1f} ms):")
    log("| switch | gmbd pause | gmbd resume | gmbd total | baseline pause | baseline resume | baseline total |")
    log("|---|---|---|---|---|---|---|")
    for name, p, r, b in rows:
        bp, br = b if b else (float("nan"), float("nan"))
        log(f"| {name} | {p:.1f} ms | {r:.1f} ms | {p + r:.1f} ms | {bp:.1f} ms | {br:.1f} ms | {bp + br:.1f} ms |")
    log(f"[{drv.label}] memory after each pause: " + "; ".join(drv.free_checks))
    log(f"[{drv.label}] trainer loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    return {"label": drv.label, "via": drv.via, "median_ms": t, "baseline_ms": base, "gmbctl_overhead_ms": overhead,
            "losses": losses, "failures": drv.failures, "free_checks": drv.free_checks}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("driver", "trainer", "infer"), default="driver")
    ap.add_argument("--gmbctl")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", choices=("warm", "cold"), default="warm")
    ap.add_argument("--baseline")
    ap.add_argument("--json")
    ap.add_argument("--switch", action="store_true",
                    help="drive each turn by one switch OFF ON instead of pause + resume")
    ap.add_argument("--via", choices=("api", "gmbctl"), default="api",
                    help="how the driver acts: libgmb's Python API (default) or gmbctl")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    if args.role == "trainer":
        return trainer()
    if args.role == "infer":
        return infer()
    drv = Driver(args)
    try:
        overhead = median([drv.ctl("status")[1] for _ in range(5)])
        losses, spec = drv.run(args.rounds)
        base = run_baseline(args.baseline, spec, args.rounds, args.gmbctl) if args.baseline else None
        summary = report(drv, losses, base, overhead)
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        import traceback

        traceback.print_exc()
        print(f"RESULT: FAIL - {args.label}: {type(e).__name__}: {e}", flush=True)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    t = summary["median_ms"]
    b = summary["baseline_ms"] or {}
    how = ("switch" if args.switch else "pause + resume") + f" via {args.via}"
    def base(pause, resume):
        """' (baseline N ms)' where the baseline ran, else nothing."""
        return f" (baseline {b[pause] + b[resume]:.1f})" if pause in b and resume in b else ""

    detail = (f"{args.label} ({how}): {args.rounds} rounds, both sides correct each round; median switch "
              f"trainer->inference {t['pause_trainer'] + t['resume_infer']:.1f} ms"
              f"{base('pause_A', 'resume_B')}, "
              f"inference->trainer {t['pause_infer'] + t['resume_trainer']:.1f} ms"
              f"{base('pause_B', 'resume_A')}")
    if drv.failures:
        print(f"RESULT: FAIL - {args.label}: " + "; ".join(drv.failures[:3]), flush=True)
        return 1
    print(f"RESULT: PASS - {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
