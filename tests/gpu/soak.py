"""GPU soak: an inference engine, a trainer and a churning third process
share one GPU through gmbd while gmbctl pauses and resumes random subsets
of their tags, round after round.

    soak.py --gmbd build-gpu/gmbd --gmbctl build-gpu/gmbctl [--rounds 200] [--seed 1]
            [--sdpa math|default]

Driver (this process, no CUDA context): starts its own gmbd (cuda backend)
on a temp socket, then
  infer   preload shim + gmb.torch_memory_saver: weights (preserve), KV
          cache (discard), a step (prefill + one decode token) captured
          through cuda_graph(..., tag="cuda_graph");
  trainer preload shim, GMB_DEFAULT_TAG=train (preserve): every tensor
          (weights, grads, AdamW state, activations, workspaces) is gmbd's;
  churn   gmb's Python client only: random sizes allocated and freed
          through gmbd in its tag "churn";
  a reference trainer, without gmbd, runs the same steps uninterrupted.
Per round: random modes for kv_cache, cuda_graph and churn (workers set
them), `gmbctl pause` of a random non-empty subset of the tags, churn
allocates/frees while they are paused, checks, `gmbctl resume`, then the
engine replays (bit-exact against its first replay; a zero-mode KV cache
must read zero first) and the trainer trains (losses equal to the
reference's, bit for bit). Checks every round: gmbd's lent bytes equal the
sum of the active tags, paused tags are paused, NVML's used memory minus
gmbd's held bytes stays within 512 MiB of the first round's (the CUDA
contexts and ordinary memory of the workers), gmbd's open fds beyond the
one it keeps for each chunk do not grow.
The last line: "RESULT: PASS|FAIL - rounds, bytes moved, time".
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
GiB = 1 << 30
STEPS = 2  # trainer steps per round
DET_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def serve(handlers):
    out = sys.stdout
    sys.stdout = sys.stderr
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


def sdpa_ctx(name):
    import contextlib

    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


# Workers.

def trainer_state(sdpa):
    import torch

    from torch_common import new_model, prompt_tokens

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    model = new_model(dtype=torch.float32, d=512, heads=8, layers=2).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batch = prompt_tokens(8, 129)

    def train(steps):
        losses = []
        with sdpa_ctx(sdpa):
            for _ in range(steps):
                loss = model.loss(batch)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.item()))
        return losses
    return train


def trainer(sdpa):
    import gmb

    train = trainer_state(sdpa)
    client = gmb.default_client()

    def step():
        return {"losses": train(STEPS)}

    def set_mode(tag, mode):
        client.set_mode(tag, mode)
        return {}

    serve({"train": step, "mode": set_mode})


def reference(sdpa, steps):
    train = trainer_state(sdpa)
    print(json.dumps({"losses": train(steps)}), flush=True)


def infer(sdpa):
    import torch

    import gmb
    from gmb.torch_memory_saver import torch_memory_saver as saver
    from torch_common import bits_equal, capture, new_model, prompt_tokens

    client = gmb.default_client()
    with saver.region("weights", enable_cpu_backup=True):
        model = new_model(d=512, heads=8, layers=4).eval()
    with saver.region("kv_cache"):
        kv_k, kv_v = model.kv_cache(16, 512)
    prompt = prompt_tokens(16, 128)
    with torch.no_grad(), sdpa_ctx(sdpa):
        g, out = capture(lambda: model.step(prompt, kv_k, kv_v),
                         lambda graph: saver.cuda_graph(graph, tag="cuda_graph"))
        g.replay()
        torch.cuda.synchronize()
        ref = out.clone()

    def replay(kv_zero=False):
        with torch.no_grad():
            zero = bool((kv_k.view(torch.int16) == 0).all() and (kv_v.view(torch.int16) == 0).all())
            g.replay()
            torch.cuda.synchronize()
        return {"same": bits_equal(out, ref), "kv_zero": zero}

    def set_mode(tag, mode):
        client.set_mode(tag, mode)
        return {}

    serve({"replay": replay, "mode": set_mode})


def churn(seed):
    import gmb

    rng = random.Random(seed)
    c = gmb.default_client()
    live = []  # pointers in tag churn

    def work(ops, cap):
        moved = 0
        with c.region("churn", "discard"):
            for _ in range(ops):
                if live and (rng.random() < 0.5 or sum(s for _, s in live) > cap):
                    p, s = live.pop(rng.randrange(len(live)))
                    c.free(p)
                else:
                    s = rng.randint(1, 128) * 2 * MiB
                    try:
                        live.append((c.malloc(s), s))
                    except gmb.GmbError as e:
                        if e.errno != 12:  # ENOMEM: the GPU is full this round
                            raise
                        continue
                moved += s
        return {"moved": moved, "live": len(live), "bytes": sum(s for _, s in live)}

    def set_mode(tag, mode):
        c.set_mode(tag, mode)
        return {}

    serve({"work": work, "mode": set_mode})


class Worker:
    def __init__(self, role, name, env, extra=()):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role, *extra],
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
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def smi_used_bytes():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, timeout=30).stdout
    return int(out.strip().splitlines()[0]) * MiB


class Soak:
    def __init__(self, args, sock, gmbd_pid):
        self.args, self.sock, self.gmbd_pid = args, sock, gmbd_pid
        self.rng = random.Random(args.seed)
        self.failures = []
        self.moved = 0
        self.copied = 0
        self.fd0 = None
        self.max_chunks = 0
        self.overhead0 = None
        self.max_dev = 0

    def ctl(self, *argv):
        p = subprocess.run([self.args.gmbctl, "--socket", self.sock, *argv], capture_output=True,
                           text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"gmbctl {' '.join(argv)}: {p.stderr.strip()}")
        return p.stdout

    def status(self):
        return json.loads(self.ctl("status", "--json"))

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"FAILED: {what}")

    def tags(self, st):
        """{(client name, tag): tag dict}"""
        return {(c["name"], t["name"]): t for c in st["clients"] for t in c["tags"]}

    def check_status(self, r, paused):
        st = self.status()
        tags = self.tags(st)
        dev = st["devices"][0]
        active = sum(t["bytes"] for t in tags.values() if t["state"] != "paused")
        self.expect(dev["used_bytes"] == active,
                    f"round {r}: gmbd lends {dev['used_bytes']} bytes, the active tags hold {active}")
        for key in paused:
            self.expect(key in tags and tags[key]["state"] == "paused", f"round {r}: {key} not paused")
        smi = smi_used_bytes()
        overhead = smi - dev["pool_bytes"]
        if self.overhead0 is None:
            self.overhead0 = overhead
        dev_ = abs(overhead - self.overhead0)
        self.max_dev = max(self.max_dev, dev_)
        self.expect(dev_ <= 512 * MiB, f"round {r}: NVML used {smi / GiB:.2f} GiB vs gmbd held "
                    f"{dev['pool_bytes'] / GiB:.2f} GiB: the rest moved by {dev_ / MiB:.0f} MiB")
        # gmbd keeps one fd for each chunk it holds (its export), so its fd
        # count follows the chunks; what must not grow is the rest.
        nfd = len(os.listdir(f"/proc/{self.gmbd_pid}/fd"))
        chunks = sum(d["chunks_created"] - d["chunks_released"] for d in st["devices"])
        extra = nfd - chunks
        self.max_chunks = max(self.max_chunks, chunks)
        if self.fd0 is None:
            self.fd0 = extra
        self.expect(extra <= self.fd0, f"round {r}: gmbd has {nfd} open fds for {chunks} chunks, "
                    f"{extra} beyond them ({self.fd0} after round 0)")
        return tags

    def run(self):
        a = self.args
        base = dict(os.environ, GMB_SOCKET=self.sock, GMB_CONTROL="accept", PYTHONUNBUFFERED="1", **DET_ENV)
        shim = dict(base, LD_PRELOAD=os.environ["GMB_PRELOAD_LIB"])
        ref = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "reference",
                                "--sdpa", a.sdpa, "--steps", str(STEPS * (a.rounds + 1))],
                               stdout=subprocess.PIPE, text=True,
                               env={k: v for k, v in base.items() if k != "LD_PRELOAD"})
        sd = ["--sdpa", a.sdpa]
        inf = Worker("infer", "soak-infer", dict(shim, GMB_CLIENT_NAME="soak-infer"), sd)
        tr = Worker("trainer", "soak-trainer", dict(shim, GMB_CLIENT_NAME="soak-trainer",
                                                    GMB_DEFAULT_TAG="train", GMB_DEFAULT_MODE="preserve"), sd)
        ch = Worker("churn", "soak-churn", dict(base, GMB_CLIENT_NAME="soak-churn"),
                    ["--seed", str(a.seed)])
        workers = {"soak-infer": inf, "soak-trainer": tr, "soak-churn": ch}
        t0 = time.monotonic()
        try:
            ref_losses = json.loads(ref.communicate(timeout=600)[0])["losses"]
            losses = tr.cmd("train")["losses"]
            ch.cmd("work", ops=4, cap=2 * GiB)
            modes = {("soak-infer", "kv_cache"): "discard", ("soak-infer", "cuda_graph"): "discard",
                     ("soak-churn", "churn"): "discard"}
            for r in range(a.rounds):
                for (cl, tag) in modes:
                    # churn's tag is GiBs: preserve would pin host copies of it each round
                    m = self.rng.choice(("discard", "zero") if cl == "soak-churn" else
                                        ("discard", "zero", "preserve"))
                    modes[(cl, tag)] = m
                    workers[cl].cmd("mode", tag=tag, mode=m)
                tags = self.tags(self.status())
                keys = sorted(k for k, t in tags.items() if t["allocations"] > 0)
                pick = [k for k in keys if self.rng.random() < 0.5] or [self.rng.choice(keys)]
                if self.rng.random() < 0.1:  # a whole client at once, now and then
                    cl = self.rng.choice(sorted({k[0] for k in keys}))
                    pick = [k for k in keys if k[0] == cl]
                    self.ctl("pause", cl)
                else:
                    for cl, tag in pick:
                        self.ctl("pause", cl, tag)
                nbytes = sum(tags[k]["bytes"] for k in pick)
                self.copied += sum(tags[k]["bytes"] for k in pick if tags[k]["mode"] == "preserve")
                churn_paused = ("soak-churn", "churn") in pick
                if not churn_paused:
                    ch.cmd("work", ops=self.rng.randint(1, 6), cap=2 * GiB)
                self.check_status(r, pick)
                for cl in sorted({k[0] for k in pick}):
                    self.ctl("resume", cl)
                self.moved += 2 * nbytes
                rep = inf.cmd("replay")
                self.expect(rep.get("same") is True, f"round {r}: graph output differs ({pick}, {modes}): {rep}")
                if ("soak-infer", "kv_cache") in pick and tags[("soak-infer", "kv_cache")]["mode"] == "zero":
                    self.expect(rep.get("kv_zero") is True, f"round {r}: zero-mode KV cache not zero")
                got = tr.cmd("train")
                losses += got.get("losses", [])
                want = ref_losses[:len(losses)]
                self.expect(losses == want, f"round {r}: trainer losses {losses[-STEPS:]} != reference "
                            f"{want[-STEPS:]}")
                if len(self.failures) > 20:
                    break
            wall = time.monotonic() - t0
        finally:
            for w in workers.values():
                w.quit()
        return r + 1, wall


def start_gmbd(gmbd, sock, logf):
    p = subprocess.Popen([gmbd, "--backend", os.environ.get("GMBD_BACKEND", "cuda"), "--socket", sock,
                          "--log-level", "info"], stdout=logf, stderr=subprocess.STDOUT)
    for _ in range(300):
        if p.poll() is not None:
            raise RuntimeError(f"gmbd exited with {p.returncode}")
        if os.path.exists(sock):
            return p
        time.sleep(0.1)
    raise RuntimeError("gmbd did not make its socket in 30 s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--gmbd")
    ap.add_argument("--gmbctl")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--sdpa", default="math", choices=("math", "default"))
    a = ap.parse_args()
    if a.role == "trainer":
        return trainer(a.sdpa)
    if a.role == "infer":
        return infer(a.sdpa)
    if a.role == "churn":
        return churn(a.seed)
    if a.role == "reference":
        return reference(a.sdpa, a.steps)
    tmp = tempfile.mkdtemp(prefix="gmb-soak.")
    sock = os.path.join(tmp, "gmbd.sock")
    logpath = os.environ.get("SOAK_GMBD_LOG", os.path.join(tmp, "gmbd.log"))
    with open(logpath, "ab") as logf:
        gmbd = start_gmbd(a.gmbd, sock, logf)
        try:
            s = Soak(a, sock, gmbd.pid)
            rounds, wall = s.run()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            print(f"RESULT: FAIL - {type(e).__name__}: {e}", flush=True)
            return 1
        finally:
            gmbd.terminate()
            gmbd.wait(30)
    ok = not s.failures and rounds == a.rounds
    what = "; ".join(s.failures[:3]) + (f" (+{len(s.failures) - 3} more)" if len(s.failures) > 3 else "")
    print(f"RESULT: {'PASS' if ok else 'FAIL'} - {rounds} rounds, {s.moved / GiB:.1f} GiB paused and "
          f"resumed ({s.copied / GiB:.1f} GiB of it preserved), {wall:.0f} s; NVML vs gmbd within "
          f"{s.max_dev / MiB:.0f} MiB, gmbd fds beyond its chunks' {s.fd0} (up to {s.max_chunks} chunks)"
          f"{'; ' + what if what else ''}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
