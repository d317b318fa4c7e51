"""A tensor-parallel pair switched as one group: two ranks, one per GPU,
each half of a small model whose captured decode graph holds an NCCL
all-reduce, and a trainer pair that gets the GPUs in between.

    tp_pair.py --gmbd build-gpu/gmbd --gmbctl build-gpu/gmbctl [--rounds 10]

Driver (this process, no CUDA context): with fewer than two GPUs it prints
"RESULT: SKIP - ..." and exits 77. Else it starts its own gmbd (cuda
backend) on a temp socket, then
  tp0, tp1   preload shim + gmb.torch_memory_saver, GMB_GROUP=tp (the pair
             as one group where gmbd knows groups), NCCL_GRAPH_REGISTER=0:
             rank r on GPU r holds half of each layer (columns of the first
             matrix, rows of the second, as Megatron splits an MLP), its
             weights in tag "weights" (preserve) and a KV cache in
             "kv_cache" (discard); one step (prefill of the cache + one
             decode step whose layers end in an all-reduce) is captured into
             a CUDA graph in tag "cuda_graph";
  tr0, tr1   preload shim, GMB_DEFAULT_TAG=train (preserve): one trainer per
             GPU (CUDA_VISIBLE_DEVICES=r), as in soak.py; a reference run
             without gmbd gives their losses.
Per round: the pair is switched out (`gmbctl switch` when gmbd has it and
TP_SWITCH names its arguments, else `gmbctl pause` of both ranks), the
trainers resume and train (losses equal to the reference, bit for bit),
pause, the pair is switched back in, replays, and each rank's output must
equal its first replay bit for bit and the other rank's (after the
all-reduce both hold the same sum). The last line: "RESULT: PASS|FAIL|SKIP - ...".
"""

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import soak  # noqa: E402 - the workers' plumbing and the trainer are soak.py's

MiB = 1 << 20
GiB = 1 << 30
STEPS = soak.STEPS


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# The ranks.

def tp_rank(rank, port):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import gmb
    from gmb.torch_memory_saver import torch_memory_saver as saver
    from torch_common import bits_equal, capture

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    gmb.default_client()  # connected before the tags are made
    d, hidden, layers, batch, ctx = 1024, 4096, 4, 16, 256
    half = hidden // 2
    gen = torch.Generator().manual_seed(0)  # the same full weights on both ranks
    with saver.region("weights", enable_cpu_backup=True):
        w1, w2 = [], []
        for _ in range(layers):
            a = torch.randn(d, hidden, generator=gen) / d ** 0.5
            b = torch.randn(hidden, d, generator=gen) / hidden ** 0.5
            w1.append(a[:, rank * half:(rank + 1) * half].contiguous().to("cuda", torch.bfloat16))
            w2.append(b[rank * half:(rank + 1) * half].contiguous().to("cuda", torch.bfloat16))
    with saver.region("kv_cache"):
        kv = torch.empty(layers, batch, ctx, d, device="cuda", dtype=torch.bfloat16)
    x0 = (torch.randn(batch, ctx, d, generator=torch.Generator().manual_seed(1)) * 0.1).to(
        "cuda", torch.bfloat16)

    def mlp(i, x):
        y = F.gelu(x @ w1[i]) @ w2[i]
        dist.all_reduce(y)  # the pair's halves summed: the same tensor on both ranks
        return x + y

    def step():
        # Prefill writes the whole cache, so a discarded one is whole again.
        x = x0
        for i in range(layers):
            kv[i].copy_(x)
            x = mlp(i, x)
        # Decode one token: attention over the cache, then the layer.
        t = x[:, -1:, :]
        for i in range(layers):
            att = torch.softmax((t @ kv[i].transpose(1, 2)).float() / d ** 0.5, -1).to(t.dtype)
            t = mlp(i, t + att @ kv[i])
        return t

    dist.all_reduce(torch.ones(1, device="cuda"))  # NCCL's setup before capture
    torch.cuda.synchronize()
    g, out = capture(step, lambda graph: saver.cuda_graph(graph, tag="cuda_graph"))
    g.replay()
    torch.cuda.synchronize()
    ref = out.clone()

    def replay():
        g.replay()
        torch.cuda.synchronize()
        return {"same": bits_equal(out, ref)}

    def bits():
        return {"hex": out.contiguous().view(torch.int16).cpu().numpy().tobytes().hex()}

    soak.serve({"replay": replay, "bits": bits})
    dist.destroy_process_group()


# The driver.

class Rank(soak.Worker):
    """soak.py's worker plumbing for a rank: started first, its ready line read later
    (init_process_group waits for the other rank)."""

    def __init__(self, rank, port, env):
        self.name = f"tp-rank{rank}"
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "tp",
                                      "--rank", str(rank), "--port", str(port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, bufsize=1)

    def wait_ready(self):
        self.ready = self._read()

class Pair:
    def __init__(self, args, sock):
        self.args, self.sock = args, sock
        self.failures = []
        self.switch = os.environ.get("TP_SWITCH", "")

    def ctl(self, *argv):
        p = subprocess.run([self.args.gmbctl, "--socket", self.sock, *argv], capture_output=True,
                           text=True, timeout=180)
        if p.returncode != 0:
            raise RuntimeError(f"gmbctl {' '.join(argv)}: {p.stderr.strip()}")
        return p.stdout

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            soak.log(f"FAILED: {what}")

    def group(self, op):
        """Switches the pair out (pause) or in (resume) as one."""
        if self.switch:
            # TP_SWITCH="switch --out {group} ..." style: gmbctl's own syntax, given by the caller.
            self.ctl(*shlex.split(self.switch.format(op=op, group="tp")))
            return "switch"
        for r in (0, 1):
            self.ctl(op, f"tp-rank{r}")
        return "pause/resume of both ranks"

    def trainers(self, op):
        for r in (0, 1):
            self.ctl(op, f"tp-trainer{r}")

    def run(self):
        a = self.args
        base = dict(os.environ, GMB_SOCKET=self.sock, GMB_CONTROL="accept", PYTHONUNBUFFERED="1",
                    NCCL_GRAPH_REGISTER="0", **soak.DET_ENV)
        shim = dict(base, LD_PRELOAD=os.environ["GMB_PRELOAD_LIB"])
        plain = {k: v for k, v in base.items() if k != "LD_PRELOAD"}
        refs = [subprocess.Popen([sys.executable, os.path.join(HERE, "soak.py"), "--role", "reference",
                                  "--sdpa", "math", "--steps", str(STEPS * a.rounds)],
                                 stdout=subprocess.PIPE, text=True,
                                 env=dict(plain, CUDA_VISIBLE_DEVICES=str(r))) for r in (0, 1)]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        workers = {}
        t0 = time.monotonic()
        try:
            # Both ranks start at once: init_process_group waits for the other.
            for r in (0, 1):
                workers[f"tp{r}"] = Rank(r, port, dict(shim, GMB_CLIENT_NAME=f"tp-rank{r}",
                                                       GMB_GROUP="tp"))
            for r in (0, 1):
                workers[f"tp{r}"].wait_ready()
            first = [workers[f"tp{r}"].cmd("bits")["hex"] for r in (0, 1)]
            self.expect(first[0] == first[1], "the ranks' outputs differ before any switch")
            how = self.group("pause")
            for r in (0, 1):
                # soak.py's trainer, on GPU r (its device 0: libgmb maps it to gmbd's r by uuid).
                workers[f"tr{r}"] = soak.Worker("trainer", f"tp-trainer{r}",
                                                dict(shim, GMB_CLIENT_NAME=f"tp-trainer{r}",
                                                     CUDA_VISIBLE_DEVICES=str(r), GMB_DEFAULT_TAG="train",
                                                     GMB_DEFAULT_MODE="preserve"), ["--sdpa", "math"])
            ref_losses = []
            for p in refs:
                line = p.stdout.readline()
                ref_losses.append(json.loads(line)["losses"] if line else [])
                p.wait(120)
            losses = [[], []]
            for rnd in range(a.rounds):
                if rnd:
                    self.group("pause")
                    self.trainers("resume")
                for r in (0, 1):
                    losses[r] += workers[f"tr{r}"].cmd("train")["losses"]
                    want = ref_losses[r][:len(losses[r])]
                    self.expect(losses[r] == want, f"round {rnd}: trainer {r} losses {losses[r][-STEPS:]} "
                                f"!= reference {want[-STEPS:]}")
                self.trainers("pause")
                self.group("resume")
                reps = [workers[f"tp{r}"].cmd("replay") for r in (0, 1)]
                for r in (0, 1):
                    self.expect(reps[r]["same"], f"round {rnd}: rank {r}'s output changed after the switch")
                hexes = [workers[f"tp{r}"].cmd("bits")["hex"] for r in (0, 1)]
                self.expect(hexes[0] == hexes[1], f"round {rnd}: the ranks' outputs differ")
                if len(self.failures) > 10:
                    break
            wall = time.monotonic() - t0
        finally:
            for w in workers.values():
                w.quit()
        return rnd + 1, wall, how


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--gmbd")
    ap.add_argument("--gmbctl")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.role == "tp":
        return tp_rank(a.rank, a.port)
    n = gpu_count()
    if n < 2:
        print(f"RESULT: SKIP - {n} GPU(s): the tensor-parallel pair needs two (kind nvidia-h200-x2)",
              flush=True)
        return 77
    tmp = tempfile.mkdtemp(prefix="gmb-tp.")
    sock = os.path.join(tmp, "gmbd.sock")
    logpath = os.environ.get("TP_GMBD_LOG", os.path.join(tmp, "gmbd.log"))
    with open(logpath, "ab") as logf:
        gmbd = soak.start_gmbd(a.gmbd, sock, logf)
        try:
            pair = Pair(a, sock)
            rounds, wall, how = pair.run()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            print(f"RESULT: FAIL - {type(e).__name__}: {e}", flush=True)
            return 1
        finally:
            gmbd.terminate()
            gmbd.wait(30)
    ok = not pair.failures and rounds == a.rounds
    what = "; ".join(pair.failures[:3]) + (f" (+{len(pair.failures) - 3} more)" if len(pair.failures) > 3 else "")
    print(f"RESULT: {'PASS' if ok else 'FAIL'} - {rounds} rounds of a 2-rank tensor-parallel pair (NCCL "
          f"all-reduce in its captured graph) switched out and back by {how}, a trainer pair in "
          f"between; outputs bit-exact on both ranks and across rounds, trainer losses equal to "
          f"the reference; {wall:.0f} s{'; ' + what if what else ''}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
