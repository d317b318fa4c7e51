"""torch_objects.py - named objects (README "Named objects") with PyTorch on a GPU.

    torch_objects.py --case readers|versions|readonly|pause|restart --gmbctl build-gpu/gmbctl
                     [--gmbd build-gpu/gmbd]   (restart: the gmbd it starts itself)

The first process (the driver) stays outside gmbd: no shim, no gmbd client.
Its CUDA context only reads the driver's free memory (torch.cuda.mem_get_info)
before the case and after every process of it exited; it reads gmbd's state
with `gmbctl status --json` and pauses, resumes and drops objects with
gmbctl. The trainer, writers and readers are torch.multiprocessing spawn
children (restart: the engines are programs of their own, to time a process
from its start); each is a gmbd client through gmb.default_client() and
gmb.objects, without the preload shim.

This file holds the driver (Driver, one case_* method a case) and main; the
children's roles, the engines and the model are in tests/gpu/objects_roles.py
(a spawn child imports it by name from the driver's sys.path), the gmbd that
--case restart starts and kills in tests/gpu/objects_gmbd.py. An engine is
this script run again with --role engine | file-engine.

--case readers   a trainer builds a transformer-shaped bf16 model of 16 GiB
   (--gib; tensors of 2-256 MiB and the norms' small ones, filled from a
   seeded CUDA generator), runs one forward (the reference) and publishes
   its state dict (gmb.objects.publish_state_dict). Four readers, one after
   another, open it (open_state_dict) and load it into a copy of the module
   made on the meta device (load_state_dict(assign=True): no copy); then all
   four run the same forward on the same input: each output must be the
   trainer's bit for bit. Prints the readers' open times (median, and
   libgmb's object_open alone) and what load_state_dict and the first
   forward took. MISS when the median open passes 50 ms (the issue's goal).
--case versions  a writer publishes ten versions of a 2 GiB state dict one
   after another (each version's bytes its own), writing each version's
   checksum to a file as it commits it; two readers meanwhile loop: open the
   latest, checksum every tensor, close. Every checksum a reader saw must
   be the one recorded for the version it opened (no torn or mixed read).
--case readonly  a reader's kernel writes into a version (add_ on a view of
   one of its tensors) in a child of its own: the write must end in a CUDA
   error (the mapping is read-only on the device) and another process must
   then read the version's bytes unchanged.
--case pause     an 8 GiB object, two readers holding it. `gmbctl object
   pause NAME`: the driver's free memory grows by the object's bytes by the
   time gmbctl returns, gmbd lists the readers' imports unmapped (the
   readers do not touch their tensors meanwhile); `gmbctl object resume
   NAME`: the readers' tensors, at the same data_ptr(), have the same
   checksums. Then `object pause --discard` and resume: every byte zero.
   Prints the pause and resume times.
--case restart   a trainer publishes a 16 GiB model and writes the same
   state dict to a file (safetensors when the package is there, else
   torch.save; loaded with safetensors' load_file or torch.load(mmap=True))
   and exits. An engine (a new process) opens the object and runs a first
   forward; it is SIGKILLed; a second engine does the same: the time from
   its process start to its first output, and its open + first forward, are
   printed next to a third process that loads the same bytes from the file
   (in the page cache: read once before) and copies them to the GPU. Then
   gmbd itself is SIGKILLed and started again with its fd store, as
   tests/gpu/gpu_restart.py plays systemd (this case starts that gmbd
   itself, --pool-keep 0, on a socket of its own), and a fourth engine
   opens and runs its first forward. Every output bit-exact with the
   trainer's. MISS when an open + first forward passes 1 s.

Every case drops what it published and ends with `gmbctl status --json`
listing no object and no import, and the driver's free memory within 64 MiB
of what it was before (run against a gmbd with --pool-keep 0, so that freed
memory goes back to the driver; tests/gpu/torch_run.sh starts one).

The restart case's file goes to $GMB_OBJ_FILE_DIR if set, else a folder
under $TMPDIR (16 GiB on disk or tmpfs), removed once read.

Needs $GMB_SOCKET (but restart), $GMB_LIB, PYTHONPATH with client/python and
tests/gpu. Prints "RESULT: PASS|FAIL|MISS - detail" last; exit 0 on PASS and
MISS (a goal missed, every check passed), 1 on FAIL.
"""

import time

T_MODULE = time.monotonic()  # before torch: an engine's start, as near as Python lets us

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from objects_gmbd import ManagedGmbd  # noqa: E402
from objects_roles import (GiB, MiB, child_entry, cuda_ready, engine_main,  # noqa: E402
                           layers_for, log, ms_since)
from torch_common import median  # noqa: E402
from torch_ipc_common import Ctl, answer, ask  # noqa: E402

FREE_SLACK = 64 * MiB
WAIT_S = 180
ENGINE_WAIT_S = 90  # an engine's start to its first output: a few seconds when well
GOAL_OPEN_MS = 50.0  # the goal: 16 GiB opened in 50 ms
GOAL_FIRST_MS = 1000.0  # open + first forward of 16 GiB
CASES = {  # case: (GiB of the object, readers)
    "readers": (16, 4),
    "versions": (2, 2),
    "readonly": (1, 1),
    "pause": (8, 2),
    "restart": (16, 1),
}
VERSIONS = 10


# The driver (no shim, not a gmbd client).

class Child:
    def __init__(self, proc, conn, label):
        self.proc, self.conn, self.label = proc, conn, label

    def ask(self, msg, timeout=WAIT_S):
        return ask(self.conn, msg, timeout)

    def answer(self, timeout=WAIT_S):
        return answer(self.conn, timeout)

    def send(self, msg):
        self.conn.send(msg)


class Driver:
    def __init__(self, args):
        self.args = args
        self.ctl = Ctl(args.gmbctl)
        self.failures = []
        self.misses = []
        self.children = []
        self.procs = []
        self.names = []
        self.gib, self.nreaders = CASES[args.case]
        if args.gib:
            self.gib = args.gib

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            log(f"[driver] FAILED: {what}")
        return ok

    def new_name(self, what):
        name = f"gmbtest.{what}.{os.getpid()}"
        self.names.append(name)
        return name

    def spawn(self, role, label, params):
        """A torch.multiprocessing spawn child running ``role``; it connects to gmbd as
        ``label`` (GMB_CLIENT_NAME, read by libgmb at its first connect)."""
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        saved = os.environ.get("GMB_CLIENT_NAME")
        os.environ["GMB_CLIENT_NAME"] = label
        try:
            proc = ctx.Process(target=child_entry, args=(role, theirs, params), daemon=True)
            proc.start()
        finally:
            if saved is None:
                os.environ.pop("GMB_CLIENT_NAME", None)
            else:
                os.environ["GMB_CLIENT_NAME"] = saved
        theirs.close()
        c = Child(proc, ours, label)
        self.children.append(c)
        return c

    def join(self, c, timeout=60, code=0):
        c.proc.join(timeout)
        if c.proc.is_alive():
            c.proc.kill()
            c.proc.join(10)
            return self.expect(False, f"{c.label} did not exit")
        return self.expect(c.proc.exitcode == code, f"{c.label} exited {c.proc.exitcode}")

    def status(self):
        return self.ctl.status()

    @staticmethod
    def obj(st, name):
        return next((o for o in st.get("objects", []) if o.get("name") == name), None)

    @staticmethod
    def obj_imports(st, name):
        return [m for m in st.get("imports", []) if m.get("object") == name]

    def wait_status(self, pred, what, timeout=10.0):
        end = time.monotonic() + timeout
        while True:
            st = self.status()
            if pred(st):
                return st
            if time.monotonic() > end:
                self.expect(False, f"{what} (after {timeout:.0f} s)")
                return st
            time.sleep(0.1)

    @staticmethod
    def free():
        return torch.cuda.mem_get_info(0)[0]

    def wait_free(self, free0, timeout=20):
        end = time.monotonic() + timeout
        while True:
            free = self.free()
            if abs(free - free0) <= FREE_SLACK or time.monotonic() > end:
                return free
            time.sleep(0.2)

    def drop(self, name):
        try:
            self.ctl("object", "drop", name)
            return ""
        except RuntimeError as e:
            return str(e)

    def cleanup(self):
        """Whatever is left of ours: children killed, objects dropped."""
        for c in self.children:
            if c.proc.is_alive():
                c.proc.kill()
                c.proc.join(10)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for name in self.names:
            self.drop(name)

    def run(self):
        cuda_ready()  # the driver's own context, before the baseline
        free0 = self.free()
        st0 = self.status()
        log(f"[driver] before: driver free {free0 / GiB:.3f} GiB, gmbd lists "
            f"{len(st0.get('objects', []))} objects, {st0.get('imports_total', 0)} imports")
        self.expect(not st0.get("objects") and not st0.get("objects_total"),
                    f"objects of an earlier run still there: {st0.get('objects')}")
        detail = getattr(self, f"case_{self.args.case}")()
        return f"{detail}; {self.end_checks(free0)}"

    def end_checks(self, free0):
        for c in self.children:
            if c.proc.is_alive():
                self.join(c, 30)
        st = self.wait_status(lambda s: not s.get("objects") and not s.get("objects_total"),
                              "objects left after the case dropped them")
        self.expect(not st.get("objects"), f"objects left: {st.get('objects')}")
        st = self.wait_status(lambda s: not s.get("imports") and not s.get("imports_total"),
                              "imports left after every reader exited")
        free1 = self.wait_free(free0)
        delta = (free1 - free0) / MiB
        self.expect(abs(free1 - free0) <= FREE_SLACK,
                    f"the driver's free memory is {delta:+.0f} MiB from before the case "
                    f"(allowed: {FREE_SLACK // MiB} MiB)")
        log(f"[driver] after: driver free {free1 / GiB:.3f} GiB ({delta:+.1f} MiB)")
        return f"after: no object, no import, driver free {delta:+.1f} MiB"

    # --case readers

    def case_readers(self):
        name = self.new_name("readers")
        layers = layers_for(self.gib)
        tr = self.spawn("trainer", "obj-trainer", {"name": name, "layers": layers, "seed": 7})
        pub = tr.answer(WAIT_S)[1]
        tr.ask(("quit",))
        self.join(tr)
        log(f"[driver] published v{pub['version']}: {pub['bytes'] / GiB:.2f} GiB, "
            f"{pub['tensors']} tensors ({pub['big_tensors']} of 2 MiB or more, largest "
            f"{pub['max_tensor'] / MiB:.0f} MiB), publish {pub['publish_ms']:.1f} ms")
        st = self.status()
        o = self.obj(st, name)
        self.expect(o is not None and o.get("latest") == pub["version"],
                    f"gmbd lists the object as {o}")
        readers = [self.spawn("reader", f"obj-reader-{i}", {"name": name, "layers": layers})
                   for i in range(self.nreaders)]
        for r in readers:
            r.answer(WAIT_S)  # ("ready", pid, id): torch imported, context made
        opened = []
        for r in readers:  # one at a time: each open alone on the machine
            opened.append(r.ask(("open",))[1])
        st = self.status()
        o = self.obj(st, name) or {}
        held = sum(v.get("readers", 0) for v in o.get("versions", []))
        self.expect(held == self.nreaders, f"gmbd counts {held} readers of {name}, "
                                           f"{self.nreaders} have it open")
        self.expect(len(self.obj_imports(st, name)) == self.nreaders,
                    f"imports of {name}: {self.obj_imports(st, name)}")
        for r in readers:
            r.send(("forward",))
        outs = [r.answer()[1] for r in readers]
        same = [x["hash"] == pub["ref"] for x in outs]
        self.expect(all(same), f"outputs not bit-exact with the trainer's: {sum(same)} of "
                               f"{len(same)} equal ({[x['hash'] for x in outs]} vs {pub['ref']})")
        for r in readers:
            r.ask(("close",))
            self.join(r)
        self.expect(not self.drop(name), f"gmbctl object drop {name} failed")
        om = median([x["open_ms"] for x in opened])
        raw = median([x["object_open_ms"] for x in opened])
        load = median([x["load_ms"] for x in opened])
        fwd = median([x["forward_ms"] for x in outs])
        each = " ".join(f"{x['open_ms']:.2f}" for x in opened)
        alone = " ".join(f"{x['object_open_ms']:.2f}" for x in opened)
        log(f"[driver] opens (ms): {each}; object_open alone: {alone}")
        if om > GOAL_OPEN_MS:
            self.misses.append(f"opening {pub['bytes'] / GiB:.1f} GiB took {om:.1f} ms (median), "
                               f"goal {GOAL_OPEN_MS:.0f} ms")
        return (f"readers: {pub['bytes'] / GiB:.2f} GiB state dict ({pub['tensors']} bf16 tensors, "
                f"largest {pub['max_tensor'] / MiB:.0f} MiB) published in {pub['publish_ms']:.0f} ms; "
                f"{self.nreaders} readers opened it: open_state_dict median {om:.2f} ms "
                f"(object_open {raw:.2f} ms; goal {GOAL_OPEN_MS:.0f} ms), "
                f"load_state_dict(assign=True) {load:.1f} ms, first forward {fwd:.1f} ms; "
                f"outputs bit-exact with the trainer's: {sum(same)} of {len(same)}")

    # --case versions

    def case_versions(self):
        name = self.new_name("versions")
        tmp = tempfile.mkdtemp(prefix="gmb-objversions.")
        record = os.path.join(tmp, "versions.jsonl")
        try:
            wr = self.spawn("publisher", "obj-writer",
                            {"name": name, "gib": self.gib, "seed": 100, "versions": VERSIONS,
                             "record": record, "gap_s": 0.3})
            first = wr.answer(WAIT_S)[1]
            loops = [self.spawn("looper", f"obj-looper-{i}", {"name": name})
                     for i in range(self.nreaders)]
            for lp in loops:
                lp.answer(WAIT_S)
            for lp in loops:
                lp.send(("go",))
            time.sleep(0.5)  # the readers read version 1 a while
            wr.send(("more",))
            done = wr.answer(WAIT_S * 2)[1]
            time.sleep(0.5)  # and the last one a while
            for lp in loops:
                lp.send(("stop",))
            seen = [lp.answer(WAIT_S)[1] for lp in loops]
            wr.ask(("quit",))
            self.join(wr)
            for lp in loops:
                self.join(lp)
            with open(record) as f:
                recs = [json.loads(line) for line in f if line.strip()]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        want = {str(r["version"]): r["hash"] for r in recs}
        self.expect(len(recs) == VERSIONS and [r["version"] for r in recs] == done["versions"],
                    f"the writer recorded {[r['version'] for r in recs]}, committed {done['versions']}")
        self.expect(len(set(want.values())) == len(want), "two versions have the same checksum")
        torn, per = 0, []
        for i, s in enumerate(seen):
            for v, hashes in s["seen"].items():
                for h in hashes:
                    if want.get(v) != h:
                        torn += 1
                        other = [k for k, x in want.items() if x == h]
                        self.expect(False, f"reader {i} opened v{v} and read checksum {h}: "
                                           f"recorded {want.get(v)}"
                                           f"{f' (that of v{other[0]})' if other else ''}")
            per.append(f"{s['rounds']} opens, {len(s['seen'])} versions seen, "
                       f"open median {s['open_ms']:.2f} ms")
            self.expect(s["rounds"] > 0, f"reader {i} never read a version")
            self.expect(not s["refused"], f"reader {i}: {s['refused']} opens refused")
        self.expect(not self.drop(name), f"gmbctl object drop {name} failed")
        pm = median(done["publish_ms"])
        return (f"versions: {VERSIONS} versions of {first['bytes'] / GiB:.2f} GiB "
                f"({first['tensors']} tensors) committed one after another (publish median "
                f"{pm:.1f} ms) while {len(loops)} readers looped open latest / checksum / close "
                f"({'; '.join(per)}); every checksum read is its version's recorded one: "
                f"{'yes' if not torn else f'NO ({torn} differ)'}")

    # --case readonly

    def case_readonly(self):
        name = self.new_name("readonly")
        pub_c = self.spawn("publisher", "obj-ro-publisher", {"name": name, "gib": self.gib,
                                                             "seed": 300})
        pub = pub_c.answer(WAIT_S)[1]
        pub_c.answer(WAIT_S)  # ("done", ...)
        pub_c.ask(("quit",))
        self.join(pub_c)
        f = self.spawn("faulter", "obj-ro-writer", {"name": name})
        kind, rep = f.answer(WAIT_S)
        self.join(f)
        log(f"[driver] the writer's child: {kind}: {rep}")
        err = rep.get("error", "")
        cuda_err = kind == "fault" and any(
            s in err.lower() for s in ("illegal memory access", "illegal address",
                                       "memory access fault", "unspecified launch failure",
                                       "cuda error"))
        self.expect(cuda_err, f"the write did not end in a CUDA error: {kind} {rep}")
        self.wait_status(lambda s: not any(m.get("importer_pid") == f.proc.pid
                                           for m in s.get("imports", [])),
                         "the faulted process's open still listed after it exited")
        chk = self.spawn("checker", "obj-ro-checker", {"name": name})
        got = chk.answer(WAIT_S)[1]
        self.join(chk)
        same = got["sums"] == pub["sums"] and got["version"] == pub["version"]
        self.expect(same, f"another process reads other bytes after the write: v{got['version']} "
                          f"({sum(a != b for a, b in zip(got['sums'], pub['sums']))} sums differ)")
        self.expect(not self.drop(name), f"gmbctl object drop {name} failed")
        return (f"readonly: a kernel's add_ on a view into a {pub['bytes'] / GiB:.2f} GiB version "
                f"(tensor {rep.get('tensor')}) in a child of its own: "
                f"{'a CUDA error' if cuda_err else 'NO CUDA error'} ({err[:160] or kind}); "
                f"another process then read the version's bytes unchanged: "
                f"{'yes' if same else 'NO'}")

    # --case pause

    def case_pause(self):
        name = self.new_name("pause")
        pub_c = self.spawn("publisher", "obj-pause-publisher", {"name": name, "gib": self.gib,
                                                                "seed": 400})
        pub = pub_c.answer(WAIT_S)[1]
        pub_c.answer(WAIT_S)
        pub_c.ask(("quit",))
        self.join(pub_c)
        holders = [self.spawn("holder", f"obj-pause-reader-{i}", {"name": name})
                   for i in range(self.nreaders)]
        for h in holders:
            h.answer(WAIT_S)
        first = [h.ask(("sums",))[1] for h in holders]
        self.expect(all(x["sums"] == pub["sums"] for x in first),
                    "a reader's checksums differ from the publisher's before any pause")
        st = self.status()
        o = self.obj(st, name) or {}
        size = o.get("bytes", pub["bytes"])
        self.expect(len(self.obj_imports(st, name)) == self.nreaders,
                    f"imports of {name} before the pause: {self.obj_imports(st, name)}")
        figures, steps = {}, []
        for discard in (False, True):
            label = "discard" if discard else "preserve"
            argv = ["object", "pause", name] + (["--discard"] if discard else [])
            free_a = self.free()
            _, pause_ms = self.ctl(*argv)
            free_b = self.free()  # read once gmbctl returned
            st = self.status()
            o = self.obj(st, name) or {}
            ims = self.obj_imports(st, name)
            freed = free_b - free_a
            self.expect(freed >= size - FREE_SLACK,
                        f"{label}: the driver's free memory grew by {freed / MiB:.0f} MiB when "
                        f"gmbctl object pause returned, the object holds {size / MiB:.0f} MiB")
            self.expect(o.get("paused") is True and bool(o.get("discarded")) == discard,
                        f"{label}: gmbd lists the paused object as {o}")
            self.expect(len(ims) == self.nreaders and all(m.get("mapped") is False for m in ims),
                        f"{label}: the readers' imports while paused: {ims}")
            _, resume_ms = self.ctl("object", "resume", name)
            free_c = self.free()
            st = self.status()
            ims = self.obj_imports(st, name)
            self.expect(all(m.get("mapped") is True for m in ims),
                        f"{label}: imports after the resume: {ims}")
            after = [h.ask(("sums",))[1] for h in holders]
            same_ptr = all(x["ptrs_same"] and x["ptrs"] == y["ptrs"] for x, y in zip(after, first))
            self.expect(same_ptr, f"{label}: a reader's tensors moved across the pause")
            if discard:
                ok = all(all(v == 0 for v in x["sums"]) for x in after)
                self.expect(ok, "discard: a reader reads non-zero bytes after the resume")
            else:
                ok = all(x["sums"] == pub["sums"] for x in after)
                self.expect(ok, "preserve: a reader's checksums changed across the pause")
            figures[label] = (pause_ms, resume_ms, freed, free_b - free_c)
            steps.append(f"{label}: pause {pause_ms:.1f} ms (driver free +{freed / GiB:.2f} GiB), "
                         f"resume {resume_ms:.1f} ms (-{(free_b - free_c) / GiB:.2f} GiB), readers "
                         f"at the same data_ptr(): {'yes' if same_ptr else 'NO'}, "
                         f"{'every byte zero' if discard else 'checksums equal'}: "
                         f"{'yes' if ok else 'NO'}")
        for h in holders:
            h.ask(("close",))
            self.join(h)
        self.expect(not self.drop(name), f"gmbctl object drop {name} failed")
        return (f"pause: a {size / GiB:.2f} GiB object, {self.nreaders} readers holding it "
                f"(gmbctl times, ms): " + "; ".join(steps))

    # --case restart

    def case_restart(self):
        if not self.args.gmbd:
            raise RuntimeError("--case restart needs --gmbd")
        tmp = tempfile.mkdtemp(prefix="gmb-objrestart.")
        gm = ManagedGmbd(self.args.gmbd, tmp)
        saved_sock = os.environ.get("GMB_SOCKET")
        try:
            return self._restart(gm, tmp)
        except Exception:
            log("[driver] the managed gmbd's log:\n" + gm.log_tail(200))
            raise
        finally:
            self.cleanup()  # drops while the managed gmbd still runs
            rc = gm.stop()
            self.expect(rc == 0, f"the managed gmbd exited {rc} on SIGTERM")
            if self.failures:
                log("[driver] the managed gmbd's log:\n" + gm.log_tail())
            gm.close()
            if saved_sock is None:
                os.environ.pop("GMB_SOCKET", None)
            else:
                os.environ["GMB_SOCKET"] = saved_sock
            shutil.rmtree(tmp, ignore_errors=True)

    def engine(self, label, argv):
        """An engine program: (its FIRST report, the Popen, ms from Popen to FIRST read)."""
        env = dict(os.environ, GMB_CLIENT_NAME=label, PYTHONUNBUFFERED="1")
        env.pop("LD_PRELOAD", None)
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--gmbctl",
                              self.args.gmbctl, *argv], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        lines = queue.Queue()

        def read():
            for line in p.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        end = time.monotonic() + ENGINE_WAIT_S
        while True:
            try:
                line = lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                if p.poll() is None:  # its stacks into our log, for the reason
                    p.send_signal(signal.SIGUSR1)
                    time.sleep(2)
                raise RuntimeError(f"{label} printed no FIRST line (exit {p.poll()})")
            if line.startswith("FIRST "):
                rep = json.loads(line[6:])
                rep["start_to_first_ms"] = (rep["first_s"] - t0) * 1e3
                rep["module_after_popen_ms"] = (rep["module_s"] - t0) * 1e3
                return rep, p

    def quit_engine(self, p, label):
        try:
            p.stdin.write("quit\n")
            p.stdin.flush()
        except OSError:
            pass
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait(30)
        self.expect(rc == 0, f"{label} exited {rc}")

    def _restart(self, gm, tmp):
        name = self.new_name("restart")
        layers = layers_for(self.gib)
        ready_ms = gm.start()
        os.environ["GMB_SOCKET"] = gm.sock_path  # children, engines and gmbctl: this gmbd
        log(f"[driver] managed gmbd ready in {ready_ms:.0f} ms on {gm.sock_path}")
        free0 = self.free()
        path = os.path.join(os.environ.get("GMB_OBJ_FILE_DIR", tmp), f"{name}.weights")
        tr = self.spawn("trainer", "obj-restart-trainer",
                        {"name": name, "layers": layers, "seed": 11, "file": path})
        pub = tr.answer(WAIT_S * 2)[1]
        tr.ask(("quit",))
        self.join(tr)
        fmt = pub["format"]
        t0 = time.perf_counter()
        with open(path, "rb") as f:  # into the page cache: the baseline reads memory
            while f.read(64 * MiB):
                pass
        warm_ms = ms_since(t0)
        log(f"[driver] published v{pub['version']} ({pub['bytes'] / GiB:.2f} GiB), the trainer "
            f"exited; {fmt} file {os.path.getsize(path) / GiB:.2f} GiB read once in {warm_ms:.0f} ms")
        eng = ["--role", "engine", "--name", name, "--layers", str(layers)]

        def gone(pid):
            return lambda s: not any(m.get("importer_pid") == pid for m in s.get("imports", []))

        # A first engine, SIGKILLed after its first output.
        e1, p1 = self.engine("obj-engine-1", eng)
        p1.kill()
        p1.wait(30)
        self.wait_status(gone(e1["pid"]), "the killed engine's open still listed")
        # Its successor, timed from its process start.
        e2, p2 = self.engine("obj-engine-2", eng)
        self.quit_engine(p2, "obj-engine-2")
        # The same bytes from the file (page cache) copied to the GPU.
        fe, pf = self.engine("obj-file-engine", ["--role", "file-engine", "--file", path,
                                                 "--format", fmt, "--layers", str(layers)])
        self.quit_engine(pf, "obj-file-engine")
        os.unlink(path)
        # gmbd SIGKILLed and started again with its fd store.
        st_before = self.status()
        chunks = gm.kill()
        back_ms = gm.start()
        st_after = self.status()
        o = self.obj(st_after, name)
        self.expect(o is not None and o.get("latest") == pub["version"]
                    and o.get("bytes") == (self.obj(st_before, name) or {}).get("bytes"),
                    f"after gmbd's restart the object is {o}")
        e3, p3 = self.engine("obj-engine-3", eng)
        self.quit_engine(p3, "obj-engine-3")
        for label, e in (("engine 1", e1), ("engine 2", e2), ("the file's", fe),
                         ("engine 3 (after gmbd's restart)", e3)):
            self.expect(e["hash"] == pub["ref"], f"{label} output is not the trainer's bit for bit")
        self.expect(not self.drop(name), f"gmbctl object drop {name} failed")
        self.wait_status(lambda s: not s.get("objects") and not s.get("imports"),
                         "objects or imports left on the managed gmbd")
        free1 = self.wait_free(free0)
        delta = (free1 - free0) / MiB
        self.expect(abs(free1 - free0) <= FREE_SLACK,
                    f"the managed gmbd: driver free memory {delta:+.0f} MiB from before the trainer")
        for label, e in (("after the engine's kill", e2), ("after gmbd's restart", e3)):
            if e["open_forward_ms"] > GOAL_FIRST_MS:
                self.misses.append(f"{label}: open + first forward {e['open_forward_ms']:.0f} ms, "
                                   f"goal {GOAL_FIRST_MS:.0f} ms")
        for label, e in (("engine 1", e1), ("engine 2", e2), ("file", fe), ("engine 3", e3)):
            log(f"[driver] {label}: {json.dumps(e)}")

        def eng_line(e):
            return (f"start to first output {e['start_to_first_ms']:.0f} ms (imports "
                    f"{e['imports_s'] * 1e3:.0f}, context {e['context_s'] * 1e3:.0f}), open + first "
                    f"forward {e['open_forward_ms']:.1f} ms (open {e['open_ms']:.1f}, "
                    f"load_state_dict {e['load_ms']:.1f}, forward {e['forward_ms']:.1f})")

        return (f"restart: {pub['bytes'] / GiB:.2f} GiB published by a trainer that exited; "
                f"after a SIGKILLed engine, the next: {eng_line(e2)}; from the {fmt} file in the "
                f"page cache: start to first output {fe['start_to_first_ms']:.0f} ms, read + copy "
                f"to the GPU + first forward {fe['open_forward_ms']:.0f} ms (read "
                f"{fe['read_ms']:.0f}, copy {fe['copy_ms']:.0f}, forward {fe['forward_ms']:.1f}); "
                f"gmbd SIGKILLed ({chunks} chunk fds in its store) and back in {back_ms:.0f} ms, "
                f"then: {eng_line(e3)}; every output bit-exact with the trainer's: "
                f"{'yes' if all(e['hash'] == pub['ref'] for e in (e1, e2, fe, e3)) else 'NO'}; "
                f"managed gmbd after the drop: no object, driver free {delta:+.1f} MiB "
                f"(goal: open + first forward under {GOAL_FIRST_MS:.0f} ms)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--gmbctl", required=True, help="gmbctl to run (build-gpu/gmbctl)")
    ap.add_argument("--gmbd", help="gmbd to start (--case restart)")
    ap.add_argument("--gib", type=float, help="the object's size (readers 16, versions 2, "
                                              "readonly 1, pause 8, restart 16)")
    ap.add_argument("--role", choices=("driver", "engine", "file-engine"), default="driver",
                    help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--format", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role != "driver":
        return engine_main(args, T_MODULE)
    if not args.case:
        ap.error("--case is required")
    drv = Driver(args)
    detail = ""
    try:
        detail = drv.run()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        traceback.print_exc()
        drv.failures.append(f"{type(e).__name__}: {e}")
    finally:
        drv.cleanup()
    if drv.failures:
        print(f"RESULT: FAIL - {args.case}: " + "; ".join(drv.failures[:3]), flush=True)
        return 1
    if drv.misses:
        print(f"RESULT: MISS - {'; '.join(drv.misses)}; {detail}", flush=True)
        return 0
    print(f"RESULT: PASS - {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
