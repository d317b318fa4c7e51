"""The Python module's native API against a real gmbd (host backend).

Run by `make check` with the system python3 (no torch, no GPU):
    GMB_BUILD_DIR=build GMB_LIB=$PWD/build/libgmb.so PYTHONPATH=client/python \
        python3 -m unittest discover -s tests/python -v

One gmbd serves the whole module (the process's default client connects once);
tests that need a fresh process (environment, preload) run python3 in a child.
Memory is host memory here, so buffers are read and written with ctypes.
"""

import ctypes
import errno
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("GMB_BUILD_DIR", "build"))
os.environ.setdefault("GMB_LIB", os.path.join(BUILD, "libgmb.so"))
# These count bytes per allocation; packing is tests/test_pack.c's (and
# test_sets_pack below).
os.environ.setdefault("GMB_PACK", "off")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import gmb  # noqa: E402
import gmb.torch_memory_saver as gtms  # noqa: E402

MiB = 1 << 20


class Gmbd:
    """build/gmbd --backend host on a temporary socket, ready when it says READY=1."""

    def __init__(self, *args):
        self.dir = tempfile.mkdtemp(prefix="gmbpy.")
        self.sock = os.path.join(self.dir, "gmbd.sock")
        notify = os.path.join(self.dir, "notify")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        libc = ctypes.CDLL(None)
        cmd = [os.path.join(BUILD, "gmbd"), "--backend", "host", "--socket", self.sock,
               "--log-level", "warning", *args]
        self.proc = subprocess.Popen(
            cmd, env=dict(os.environ, NOTIFY_SOCKET=notify),
            preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))  # PR_SET_PDEATHSIG
        try:
            self._wait_ready(ns)
        finally:
            ns.close()

    def _wait_ready(self, ns):
        for _ in range(100):
            if select.select([ns], [], [], 0.1)[0] and b"READY=1" in ns.recv(512):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"gmbd exited with {self.proc.returncode} during start")
        raise RuntimeError("gmbd not ready within 10 s")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


GMBD = None


def setUpModule():
    global GMBD
    GMBD = Gmbd("--host-memory", "128MiB", "--host-devices", "2")
    os.environ["GMB_SOCKET"] = GMBD.sock


def tearDownModule():
    assert GMBD.stop() == 0, "gmbd did not exit cleanly"


def fill(ptr, byte, n):
    ctypes.memset(ptr, byte, n)


def bytes_at(ptr, n):
    return ctypes.string_at(ptr, n)


def tags_of(status, name):
    """{tag name: tag dict} of client ``name`` in a status dict."""
    for c in status["clients"]:
        if c["name"] == name:
            return {t["name"]: t for t in c["tags"]}
    raise AssertionError(f"client {name} not in status: {status}")


def run_python(code, env=None):
    """python3 -c CODE in a fresh process with this module's environment; its stdout."""
    full = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"), **(env or {}))
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"child failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


class NativeApi(unittest.TestCase):
    def client(self, name):
        c = gmb.Client(name=name, private=True)
        self.addCleanup(c.close)
        return c

    def test_sets_pack(self):
        c = self.client("packed")
        c.set_pack(gmb.PACK_HOOKS)  # what it would be without this module's GMB_PACK=off
        with c.region("p", "discard"):
            a, b = c.malloc(2 * MiB), c.malloc(2 * MiB)
        self.assertEqual(b, a + 2 * MiB, "two pieces of one pack")
        self.assertEqual(tags_of(c.status(), "packed")["p"]["bytes"], 64 * MiB)
        with self.assertRaises(gmb.GmbError) as e:
            c.set_pack(7)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        c.free(a)
        c.free(b)
        self.assertEqual(tags_of(c.status(), "packed").get("p", {}).get("bytes", 0), 0)

    def test_regions_route_raw_buffers_and_the_three_modes_hold(self):
        c = self.client("modes")
        with c.region("w", "preserve"):
            w = c.malloc(3 * MiB)
            with c.region("z", "zero"):
                z = c.malloc(MiB)
        k = c.malloc(MiB)
        tags = tags_of(c.status(), "modes")
        self.assertEqual({n: (t["mode"], t["bytes"]) for n, t in tags.items()},
                         {"w": ("preserve", 4 * MiB), "z": ("zero", 2 * MiB),
                          "default": ("discard", 2 * MiB)})
        fill(w, 0x5A, 3 * MiB)
        fill(z, 0x11, MiB)
        c.pause()
        self.assertTrue(all(t["state"] == "paused" for t in tags_of(c.status(), "modes").values()))
        c.resume()
        self.assertEqual(bytes_at(w, 3 * MiB), b"\x5a" * (3 * MiB), "preserve keeps the bytes")
        self.assertEqual(bytes_at(z, MiB), b"\0" * MiB, "zero reads zero")
        fill(k, 0x22, MiB)  # discard: mapped and writable again
        for p in (w, z, k):
            c.free(p)
        self.assertEqual(c.status()["devices"][0]["used_bytes"], 0)

    def test_regions_nest_and_belong_to_their_thread(self):
        c = self.client("threads")
        seen = {}

        def other():
            seen["region"] = gmb.current_region()
            seen["ptr"] = c.malloc(MiB)

        with gmb.region("outer", "zero"):
            with gmb.region("inner"):
                self.assertEqual(gmb.current_region(), ("inner", "discard"))
                t = threading.Thread(target=other)
                t.start()
                t.join()
            self.assertEqual(gmb.current_region(), ("outer", "zero"))
            with gmb.region(None):
                self.assertIsNone(gmb.current_region(), "a plain region is outside")
        self.assertIsNone(gmb.current_region())
        self.assertIsNone(seen["region"])
        self.assertEqual(set(tags_of(c.status(), "threads")), {"default"})
        c.free(seen["ptr"])

    def test_an_operator_pauses_and_resumes_through_on_control(self):
        w = self.client("pyworker")
        op = gmb.Client(name="op", tool=True)
        self.addCleanup(op.close)
        with w.region("kv"):
            p = w.malloc(2 * MiB)
        calls = []
        w.on_control(lambda o, tag: calls.append((o, tag)))
        op.control("pyworker", "pause", "kv")
        self.assertEqual(tags_of(op.status(), "pyworker")["kv"]["state"], "paused")
        op.control(w.id, "resume")
        self.assertEqual(calls, [("pause", "kv"), ("resume", None)])
        self.assertEqual(tags_of(op.status(), "pyworker")["kv"]["state"], "active")
        refusals = [(lambda o, t: False, 0), (lambda o, t: 1 / 0, 1), (lambda o, t: -errno.EBUSY, 0)]
        for refuse, logged in refusals:
            w.on_control(refuse)
            with self.assertRaises(gmb.GmbError), self.assertLogs("gmb", "ERROR") as logs:
                gmb.log.error("marker")  # assertLogs wants a record even when none is expected
                op.control("pyworker", "pause")
            self.assertEqual(len(logs.records), 1 + logged, "a raising handler is logged")
            self.assertEqual(tags_of(op.status(), "pyworker")["kv"]["state"], "active")
        w.on_control(None)
        with self.assertRaises(gmb.GmbError):
            op.control("pyworker", "pause")
        w.free(p)

    def test_an_operator_switches_two_clients_and_sets_a_priority(self):
        a, b = self.client("pyfrom"), self.client("pyto")
        op = gmb.Client(name="op", tool=True)
        self.addCleanup(op.close)
        for w in (a, b):
            w.on_control(lambda o, tag: True)
        with a.region("w"):
            pa = a.malloc(2 * MiB)
        with b.region("kv"):
            pb = b.malloc(2 * MiB)
        b.pause("kv")
        op.set_wait(1.5)
        report = op.switch("pyfrom", "pyto", ["w", "kv"])
        self.assertIn("created 0 B", report)  # its own warm chunks, or the trainer's
        self.assertEqual(tags_of(op.status(), "pyfrom")["w"]["state"], "paused")
        self.assertEqual(tags_of(op.status(), "pyto")["kv"]["state"], "active")
        b.on_control(lambda o, tag: o != "pause")
        with self.assertRaises(gmb.GmbError) as cm:
            op.switch("pyto", "pyfrom")
        self.assertIn("both sides are as before", cm.exception.strerror)
        self.assertIn("pause", cm.exception.report)
        op.set_priority("pyto", 7)
        self.assertEqual([c["priority"] for c in op.status()["clients"] if c["name"] == "pyto"], [7])
        with self.assertRaises(gmb.GmbError):
            op.set_priority("nobody-here", 1)
        b.on_control(None)
        a.resume()
        a.free(pa)
        b.free(pb)

    def test_status_is_the_document_gmbctl_prints(self):
        c = self.client("statusy")
        st = c.status()
        out = subprocess.run([os.path.join(BUILD, "gmbctl"), "-s", GMBD.sock, "status", "--json"],
                             capture_output=True, text=True, check=True).stdout
        ctl = json.loads(out)
        self.assertEqual(set(st), set(ctl))
        self.assertEqual(st["backend"], "host")
        self.assertEqual(len(st["devices"]), 2)
        self.assertIn(c.id, [x["id"] for x in st["clients"] if x["name"] == "statusy"])
        self.assertIn("statusy", c.status_text())

    def test_failures_raise_gmberror_with_gmbds_reason(self):
        c = self.client("errors")
        with self.assertRaises(gmb.GmbError) as e:
            c.free(0x1000)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        with self.assertRaises(gmb.GmbError) as e:
            c.pause("nosuchtag")
        self.assertEqual(e.exception.errno, errno.ENOENT)
        with gmb.region("t"):
            p = c.malloc(MiB)
            c.pause("t")
            with self.assertRaises(gmb.GmbError) as e:
                c.malloc(MiB)
            self.assertEqual(e.exception.errno, errno.EBUSY)
            self.assertIn("paused", e.exception.strerror)
        with self.assertRaises(gmb.GmbError) as e:
            c.malloc(1 << 40)
        self.assertEqual(e.exception.errno, errno.ENOMEM)
        self.assertIn("budget", e.exception.strerror)
        with self.assertRaises(gmb.GmbError) as e:
            with gmb.region(""):
                pass
        self.assertEqual(e.exception.errno, errno.EINVAL)
        with self.assertRaises(ValueError):
            gmb.region("t", "keep").__enter__()
        c.free(p)

    def test_malloc_peers_keeps_access_and_bytes_over_a_cycle(self):
        c = self.client("peers")
        c.set_mode("kv", "preserve")
        p = c.malloc_peers(3 * MiB, device=0, peers=[1], tag="kv")
        fill(p, 0x3D, 3 * MiB)
        c.pause("kv")
        c.resume("kv")
        self.assertEqual(bytes_at(p, 3 * MiB), b"\x3d" * (3 * MiB))
        with self.assertRaises(gmb.GmbError) as e:
            c.malloc_peers(MiB, device=0, peers=[5], tag="kv")
        self.assertEqual(e.exception.errno, errno.ENODEV)
        self.assertIn("peer device 5", e.exception.strerror)
        with self.assertRaises(ValueError):
            c.malloc_peers(MiB, peers=[64])
        c.free(p)

    def test_ipc_handles_open_grant_and_follow_a_pause(self):
        owner, reader = self.client("ipc-owner"), self.client("ipc-reader")
        with owner.region("w", "preserve"):
            p = owner.malloc(4 * MiB)
        fill(p, 0x2C, 4 * MiB)
        h = owner.ipc_handle(p)
        self.assertEqual(len(h), 64)
        self.assertEqual(h[:6], b"GMBIPC")
        self.assertEqual(owner.ipc_handle(p), h, "the same bytes every time")
        q = reader.ipc_open(h)
        self.assertNotEqual(q, p, "another mapping of the same memory")
        self.assertEqual(bytes_at(q, 4 * MiB), b"\x2c" * (4 * MiB))
        fill(q, 0x2D, MiB)
        self.assertEqual(bytes_at(p, MiB), b"\x2d" * MiB, "a write is seen by the owner")
        imports = owner.status()["imports"]
        self.assertEqual([(m["importer"], m["owner"], m["mapped"]) for m in imports],
                         [("ipc-reader", "ipc-owner", True)])
        # By default the pause is refused while imported, naming the reader.
        with self.assertRaises(gmb.GmbError) as e:
            owner.pause("w")
        self.assertEqual(e.exception.errno, errno.EBUSY)
        self.assertIn("ipc-reader", e.exception.strerror)
        # Following: the reader unmaps first, and is mapped again at the same address.
        owner.set_ipc_follow(True)
        owner.pause("w")
        self.assertEqual([m["mapped"] for m in owner.status()["imports"]], [False])
        owner.resume("w")
        self.assertEqual([m["mapped"] for m in owner.status()["imports"]], [True])
        self.assertEqual(bytes_at(q, MiB), b"\x2d" * MiB, "the bytes kept, at the same address")
        reader.ipc_close(q)
        self.assertEqual(owner.status()["imports"], [])
        with self.assertRaises(gmb.GmbError) as e:
            owner.ipc_grant(p, os.getuid())
        self.assertEqual(e.exception.errno, errno.EINVAL)
        owner.ipc_grant(p, 65534)
        owner.ipc_revoke(p, 65534)
        with self.assertRaises(ValueError):
            reader.ipc_open(h[:10])
        owner.free(p)

    def test_ipc_keep_holds_a_closed_import_for_the_next_open(self):
        owner, reader = self.client("keep-owner"), self.client("keep-reader")
        with owner.region("k", "preserve"):
            p = owner.malloc(2 * MiB)
        fill(p, 0x6B, 2 * MiB)
        h = owner.ipc_handle(p)
        reader.set_ipc_keep(True)
        q = reader.ipc_open(h)
        reader.ipc_close(q)
        self.assertEqual([m["idle"] for m in owner.status()["imports"]], [True])
        self.assertEqual(reader.ipc_open(h), q, "the kept mapping, at the same address")
        self.assertEqual(bytes_at(q, 2 * MiB), b"\x6b" * (2 * MiB))
        self.assertEqual([m["idle"] for m in owner.status()["imports"]], [False])
        reader.ipc_close(q)
        # The owner's pause takes the idle import back: no refusal, no follow.
        owner.pause("k")
        self.assertEqual(owner.status()["imports"], [])
        owner.resume("k")
        owner.free(p)

    def test_host_copy_and_memory_margin(self):
        c = self.client("backup")
        with gmb.region("w", "preserve"):
            p = c.malloc(2 * MiB)
        fill(p, 0x77, 2 * MiB)
        self.assertIsNone(c.host_copy(p + 10, 10), "no copy while active")
        c.pause("w")
        self.assertEqual(bytes_at(c.host_copy(p + 10, 10), 10), b"\x77" * 10)
        c.resume("w")
        gmb.set_memory_margin(120 * MiB)
        try:
            with self.assertRaises(gmb.GmbError) as e:
                c.malloc(16 * MiB)
            self.assertIn("margin", e.exception.strerror)
        finally:
            gmb.set_memory_margin(0)
        c.free(p)

    def test_the_default_client_comes_from_the_environment(self):
        out = run_python(
            "import gmb, json\n"
            "c = gmb.Client()\n"
            "p = c.malloc(1 << 20)\n"
            "assert gmb.Client()._h == c._h\n"
            "print(json.dumps(c.status()))\n",
            env={"GMB_CLIENT_NAME": "envname", "GMB_DEFAULT_TAG": "train"})
        tags = tags_of(json.loads(out), "envname")
        self.assertEqual(tags["train"]["mode"], "preserve", "GMB_DEFAULT_TAG, preserve by default")

    def test_library_path_is_the_loaded_file(self):
        self.assertEqual(gmb.library_path(), os.path.realpath(os.environ["GMB_LIB"]))
        self.assertEqual(gmb.preload_path(), os.path.join(BUILD, "libgmb_preload.so"))
        self.assertFalse(gmb.preload_active())

    def test_the_preloaded_shim_and_python_share_one_libgmb(self):
        out = run_python(
            "import gmb, ctypes\n"
            "print(gmb.preload_active(), gmb.library_path())\n",
            env={"LD_PRELOAD": os.path.join(BUILD, "libgmb_preload.so"),
                 "ASAN_OPTIONS": "verify_asan_link_order=0"})
        self.assertEqual(out.split(), ["True", os.path.realpath(os.environ["GMB_LIB"])])


class TorchMemorySaverWithoutTorch(unittest.TestCase):
    def test_importable_and_configurable_without_torch(self):
        saver = gtms.TorchMemorySaver()
        self.assertTrue(saver.enabled)
        self.assertEqual(saver.hook_mode, "preload")
        saver.hook_mode = "torch"
        with self.assertRaises(ValueError):
            saver.hook_mode = "cuda"
        self.assertIsInstance(gtms.torch_memory_saver, gtms.TorchMemorySaver)
        if importlib.util.find_spec("torch") is None:
            with self.assertRaises(ImportError):
                with saver.region("weights"):
                    pass
        with self.assertRaises(ValueError):  # checked before torch is needed
            with saver.region("w", enable_cpu_backup=True, enable_disk_backup=True):
                pass

    def test_configure_subprocess_preloads_the_shim_in_children(self):
        before = os.environ.get("LD_PRELOAD")
        with gtms.configure_subprocess():
            self.assertEqual(os.environ["LD_PRELOAD"].split(":")[0], gmb.preload_path())
            out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                                 capture_output=True, text=True,
                                 env=dict(os.environ, ASAN_OPTIONS="verify_asan_link_order=0"))
            self.assertIn("libgmb_preload.so", out.stdout)
        self.assertEqual(os.environ.get("LD_PRELOAD"), before, "restored, or absent again")

    def test_memory_margin_bytes_reaches_libgmb(self):
        c = gmb.Client(name="margin", private=True)
        self.addCleanup(c.close)
        saver = gtms.TorchMemorySaver()
        saver.memory_margin_bytes = 127 * MiB
        try:
            self.assertEqual(saver.memory_margin_bytes, 127 * MiB)
            with self.assertRaises(gmb.GmbError):
                c.malloc(2 * MiB)
        finally:
            saver.memory_margin_bytes = 0
        c.free(c.malloc(2 * MiB))


if __name__ == "__main__":
    unittest.main()
