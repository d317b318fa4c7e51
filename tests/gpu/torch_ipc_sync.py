"""torch_ipc_sync.py - RL weight updates through CUDA IPC on gmbd memory, the
way SGLang and vLLM make them, and an exporter killed while imported.

    torch_ipc_sync.py --mode sglang|vllm|kill --gmbctl build-gpu/gmbctl [--rounds N]

Three processes:

  driver   this one: no shim, not a gmbd client. Its CUDA context only reads
           the driver's free memory (torch.cuda.mem_get_info) before the
           trainer starts and after everything exited; it reads gmbd's state
           with `gmbctl status --json`.
  trainer  this script again (--role trainer) under LD_PRELOAD=libgmb_preload.so
           with GMB_DEFAULT_TAG=train (preserve) and GMB_CONTROL=accept: every
           allocation of the process is gmbd's, and gmbctl can pause it.
  engine   a torch.multiprocessing spawn child of the trainer, under the shim
           too but without the trainer's default tag; its weights are made in
           gmb.torch_memory_saver's region(tag="weights") (discard, SGLang's
           default: every byte after a resume comes from the next update).

--mode sglang  (20 rounds) the trainer holds 4 GiB of bf16 weights (tensors of
   2-100 MiB, mixed shapes). Each round it packs them into flattened buckets of
   at most 512 MiB (SGLang's FlattenedTensorBucket: the tensors' bytes
   concatenated into one uint8 buffer, names, shapes, dtypes and offsets
   beside it), serializes each bucket with ForkingPickler (SGLang's
   MultiprocessingSerializer: torch.multiprocessing's reduce_tensor, so
   cudaIpcGetMemHandle) and sends the bytes; the engine deserializes them
   (rebuild_cuda_tensor, so cudaIpcOpenMemHandle), copies each tensor into its
   own weights, drops what it received and calls torch.cuda.ipc_collect().
   The engine's checksums (computed on its GPU) must equal the trainer's.
   Between rounds gmbctl pauses and resumes both sides: the trainer's "train"
   while the engine runs, the engine's "weights" while the trainer changes
   every weight in place (so each round's bytes differ); the trainer's
   weights must survive its pause. Prints the median sync time.
--mode vllm    (5 rounds) 2 GiB: vLLM's IPC weight transfer. Per tensor
   reduce_tensor(t.detach().contiguous()), keyed by the GPU's UUID; the
   engine takes the entry of its own GPU's UUID, puts its own device index in
   args[6] and calls func(*args), then loads the weights as above.
--mode kill    a 1 GiB set of tensors and a flattened bucket with a view into
   it go to the engine through a torch.multiprocessing pipe; the driver
   SIGKILLs the trainer while the engine holds them. gmbctl status must show
   the imports with their owner gone (owner_freed), the engine must still read
   every byte it received, and after it closed them no import is left.

Every mode then checks, once both processes are gone: `gmbctl status --json`
lists no import and no client of theirs, gmbd holds no more than before, and
the driver's free memory is within 64 MiB of what it was before the trainer
started (run against a gmbd with --pool-keep 0, gmbd's default, so that
freed memory goes back to the driver; tests/gpu/torch_run.sh starts one).

Needs $GMB_SOCKET, $GMB_PRELOAD_LIB (or libgmb_preload.so next to $GMB_LIB),
PYTHONPATH with client/python and tests/gpu. Prints "RESULT: PASS|FAIL -
detail" last; the exit status follows it.

The code is in three files: this one holds the command line and the driver;
torch_ipc_workers.py the trainer and the engine; torch_ipc_common.py what
they share (weights, buckets, checksums, serialization, the pipe protocol,
gmbctl), which bench/ipc_bench.py, torch_objects.py and objects_roles.py
use too.
"""

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from torch_ipc_common import BUCKET_CAP, GiB, MiB, Ctl, ask, engine_name, log, median, trainer_name
from torch_ipc_workers import trainer_main

HERE = os.path.dirname(os.path.abspath(__file__))
FREE_SLACK = 64 * MiB
DEFAULTS = {  # rounds, GiB of weights
    "sglang": (20, 4),
    "vllm": (5, 2),
    "kill": (1, 1),
}


# The driver (no shim, not a gmbd client).

class Driver:
    def __init__(self, args):
        self.args = args
        self.ctl = Ctl(args.gmbctl)
        self.failures = []
        self.lines = queue.Queue()
        self.trainer = None
        self.engine_pid = None

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"[driver] FAILED: {what}")
        return ok

    def start_trainer(self, driver_addr=None):
        import gmb

        a = self.args
        env = dict(os.environ, LD_PRELOAD=gmb.preload_path(), GMB_DEFAULT_TAG="train",
                   GMB_DEFAULT_MODE="preserve", GMB_CONTROL="accept",
                   GMB_CLIENT_NAME=trainer_name(a.mode), PYTHONUNBUFFERED="1")
        argv = [sys.executable, os.path.abspath(__file__), "--role", "trainer", "--mode", a.mode,
                "--gmbctl", a.gmbctl, "--rounds", str(a.rounds), "--weights-gib",
                str(a.weights_gib)]
        if driver_addr:
            argv += ["--driver-addr", driver_addr]
        self.trainer = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        threading.Thread(target=self._read, args=(self.trainer.stdout,), daemon=True).start()

    def _read(self, f):
        for line in f:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, kind, timeout):
        """The trainer's next KIND line's object; ENGINE lines are noted on the way."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} line from the trainer within {timeout} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the trainer exited ({self.trainer.wait(30)}) before its "
                                   f"{kind} line")
            k, _, rest = line.partition(" ")
            if k == "ENGINE":
                self.engine_pid = json.loads(rest)["pid"]
            elif k == kind:
                return json.loads(rest)
            elif k == "TRAINER":
                rep = json.loads(rest)
                raise RuntimeError(f"the trainer stopped: {'; '.join(rep['failures'][:3])}")
            else:
                log(f"[driver] from the trainer: {line}")

    def ours(self, st):
        names = (trainer_name(self.args.mode), engine_name(self.args.mode))
        return [c for c in st["clients"] if c["name"] in names]

    def wait_status(self, pred, what, timeout=10.0):
        """gmbctl status --json until ``pred(status)``; the last status either way."""
        end = time.monotonic() + timeout
        while True:
            st = self.ctl.status()
            if pred(st):
                return st
            if time.monotonic() > end:
                self.expect(False, f"{what} (after {timeout:.0f} s)")
                return st
            time.sleep(0.1)

    def wait_free(self, free0, torch):
        """The driver's free memory, waited for (20 s at most) to come within FREE_SLACK of free0."""
        end = time.monotonic() + 20
        while True:
            free = torch.cuda.mem_get_info(0)[0]
            if abs(free - free0) <= FREE_SLACK or time.monotonic() > end:
                return free
            time.sleep(0.2)

    def cleanup(self):
        """Kills what is left of ours: the trainer (our child) and the engine (its child)."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
            self.trainer.wait(30)
        if self.engine_pid and pid_alive(self.engine_pid):
            try:
                os.kill(self.engine_pid, signal.SIGKILL)
            except OSError:
                pass
            wait_gone(self.engine_pid, 30)

    def run(self):
        import torch

        a = self.args
        torch.cuda.init()
        free0 = torch.cuda.mem_get_info(0)[0]
        st0 = self.ctl.status()
        held0 = st0["devices"][0]["held_bytes"]
        self.expect(not self.ours(st0), f"clients of an earlier run still there: {self.ours(st0)}")
        log(f"[driver] before: driver free {free0 / GiB:.3f} GiB, gmbd holds {held0 / GiB:.3f} GiB, "
            f"{st0.get('imports_total', 0)} imports")
        if a.mode == "kill":
            detail = self.run_kill()
        else:
            detail = self.run_sync()
        # Both processes are gone: nothing of theirs may be left anywhere.
        st = self.wait_status(lambda s: not s.get("imports") and not s.get("imports_total")
                              and not self.ours(s), "imports or clients left after both exited")
        st = self.wait_status(lambda s: s["devices"][0]["held_bytes"] <= held0,
                              f"gmbd holds more than the {held0} bytes it held before")
        free1 = self.wait_free(free0, torch)
        delta = (free1 - free0) / MiB
        self.expect(abs(free1 - free0) <= FREE_SLACK,
                    f"the driver's free memory is {delta:+.0f} MiB from before the trainer started "
                    f"(allowed: {FREE_SLACK // MiB} MiB)")
        log(f"[driver] after: driver free {free1 / GiB:.3f} GiB ({delta:+.1f} MiB), gmbd holds "
            f"{st['devices'][0]['held_bytes'] / GiB:.3f} GiB, {st.get('imports_total', 0)} imports")
        return f"{detail}; after both exited: no import, no client left, driver free {delta:+.1f} MiB"

    def run_sync(self):
        a = self.args
        self.start_trainer()
        rep = self.line("TRAINER", a.timeout)
        rc = self.trainer.wait(60)
        for f in rep["failures"]:
            self.expect(False, f"trainer: {f}")
        self.expect(rc == 0, f"the trainer exited {rc}")
        if rep["failures"]:
            return f"{a.mode}: failed"
        s = rep["sync_ms"]
        held = rep["held"]
        imports = max(h["imports"] for h in held) if held else 0
        head = (f"{a.mode}: {len(s)} rounds of {rep['bytes'] / GiB:.2f} GiB "
                f"({rep['tensors']} bf16 tensors of 2-100 MiB")
        if a.mode == "sglang":
            g = rep["gmbctl_ms"]
            detail = (f"{head} in {rep['buckets']} flattened buckets of at most "
                      f"{BUCKET_CAP // MiB} MiB) bit-exact every round; sync median {median(s):.1f} ms "
                      f"(min {min(s):.1f}, max {max(s):.1f}); imports listed while held; none left "
                      f"after each round; paused and resumed by gmbctl each round (median ms: trainer "
                      f"pause {g['pause_trainer']:.1f} / resume {g['resume_trainer']:.1f}, engine "
                      f"pause {g['pause_engine']:.1f} / resume {g['resume_engine']:.1f}), the trainer's "
                      f"weights intact")
        else:
            rw = held[0].get("rewritten", 0) if held else 0
            detail = (f"{head}, one reduce_tensor each, keyed by GPU UUID, args[6] set to the "
                      f"engine's device ({rw} differed)) bit-exact every round; sync median "
                      f"{median(s):.1f} ms (min {min(s):.1f}, max {max(s):.1f}); up to {imports} imports "
                      f"listed while held, none left after each round")
        log(f"[driver] sync times (ms): {' '.join(f'{x:.1f}' for x in s)}")
        return detail

    def run_kill(self):
        from multiprocessing.connection import Listener

        a = self.args
        tmp = tempfile.mkdtemp(prefix="gmb-ipc-kill.")
        addr = os.path.join(tmp, "driver.sock")
        listener = Listener(addr, family="AF_UNIX")
        try:
            self.start_trainer(addr)
            hold = self.line("HOLDING", a.timeout)
            self.engine_pid = hold["engine_pid"]
            eng = listener.accept()  # the engine connected before it took the tensors
            self.expect(hold["match"], "the engine's checksums differ from the trainer's")
            pid, tpid = hold["engine_pid"], hold["trainer_pid"]

            def imports(st):
                return [m for m in st.get("imports", []) if m.get("importer_pid") == pid]

            st = self.ctl.status()
            before = imports(st)
            self.expect(before and all(m["owner_pid"] == tpid and not m["owner_freed"] for m in before),
                        f"imports while the owner lives: {before}")
            self.expect(sum(m["bytes"] for m in before) >= hold["bytes"],
                        f"gmbd lists {sum(m['bytes'] for m in before)} bytes imported, "
                        f"{hold['bytes']} were sent")
            t0 = time.monotonic()
            self.trainer.kill()  # SIGKILL: nothing of the exporter's runs again
            self.trainer.wait(30)
            st = self.wait_status(
                lambda s: not any(c["pid"] == tpid for c in s["clients"])
                and len(imports(s)) == len(before) and all(m["owner_freed"] for m in imports(s)),
                "after the kill: the owner still listed, or its imports not marked owner_freed")
            gone_ms = (time.monotonic() - t0) * 1e3
            after = imports(st)
            log("[driver] gmbctl status after the kill:\n" + self.ctl("status")[0])
            chk = ask(eng, "check")
            self.expect(chk["equal"] and chk["sums_same"],
                        f"the engine reads other bytes after its exporter was killed: {chk}")
            self.expect(chk["imports"] == len(before) and all(chk["owner_freed"]),
                        f"the engine's view of its imports after the kill: {chk}")
            time.sleep(1.0)  # and a while later, still the same bytes
            chk2 = ask(eng, "check")
            self.expect(chk2["equal"] and chk2["sums_same"], f"a second read after the kill: {chk2}")
            held_dead = self.ctl.status()["devices"][0]["held_bytes"]
            closed = ask(eng, "close")
            self.expect(closed.get("closed") and closed.get("imports_left") == 0,
                        f"the engine's close: {closed}")
            self.wait_status(lambda s: not imports(s), "imports left after the engine closed them")
            ask(eng, "quit")
            eng.close()
            self.expect(wait_gone(pid, 60), f"the engine (pid {pid}) did not exit")
        finally:
            listener.close()  # removes the socket file too
            for f in (lambda: os.unlink(addr), lambda: os.rmdir(tmp)):
                try:
                    f()
                except OSError:
                    pass
        return (f"kill: {hold['tensors']} tensors ({hold['bytes'] / GiB:.2f} GiB, a flattened bucket "
                f"and a view into it among them) held by a spawned child when its exporter was "
                f"SIGKILLed: {len(after)} imports listed with the owner gone (owner_freed) "
                f"{gone_ms:.0f} ms after the kill, gmbd keeping {held_dead / GiB:.2f} GiB for them; "
                f"every byte still read right, twice; none left once the child closed them")


def pid_alive(pid):
    """Whether ``pid`` runs (a zombie has let go of everything: it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid, timeout):
    end = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("sglang", "vllm", "kill"), required=True)
    ap.add_argument("--gmbctl", required=True, help="gmbctl to run (build-gpu/gmbctl)")
    ap.add_argument("--rounds", type=int, help="rounds of updates (sglang 20, vllm 5)")
    ap.add_argument("--weights-gib", type=float, help="the trainer's weights (sglang 4, vllm 2, kill 1)")
    ap.add_argument("--timeout", type=float, default=150, help="seconds the trainer may take")
    ap.add_argument("--role", choices=("driver", "trainer"), default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--driver-addr", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rounds, gib = DEFAULTS[args.mode]
    args.rounds = args.rounds or rounds
    args.weights_gib = args.weights_gib or gib
    sys.path.insert(0, HERE)
    if args.role == "trainer":
        return trainer_main(args)
    drv = Driver(args)
    try:
        detail = drv.run()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        traceback.print_exc()
        drv.failures.append(f"{type(e).__name__}: {e}")
        detail = ""
    finally:
        drv.cleanup()
    if drv.failures:
        print(f"RESULT: FAIL - {args.mode}: " + "; ".join(drv.failures[:3]), flush=True)
        return 1
    print(f"RESULT: PASS - {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
