"""Named objects from Python: Client.object_* against a real gmbd (host backend),
and gmb.objects' layout and description (plain Python, no torch).

Host memory is CPU-addressable, so bytes are written with ctypes before a
publish and read back by another process that opens the version; a write
through the read-only mapping kills its process with SIGSEGV.
"""

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import unittest
import zlib

import test_gmb  # noqa: E402  (sets GMB_LIB and sys.path, and has the gmbd fixture)
from test_gmb import ROOT, Gmbd

import gmb  # noqa: E402
from gmb import objects  # noqa: E402

MiB = 1 << 20
GMBD = None


def setUpModule():
    global GMBD
    GMBD = Gmbd("--host-memory", "64MiB", "--host-devices", "1", "--max-chunk", "2MiB")


def tearDownModule():
    GMBD.stop()


def child(code):
    """python3 -c CODE against this gmbd: (returncode, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    pre = f"import ctypes, gmb\nc = gmb.Client({GMBD.sock!r}, 'child', private=True)\n"
    p = subprocess.run([sys.executable, "-c", pre + code], env=env, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


class ClientObjects(unittest.TestCase):
    def client(self, name):
        c = gmb.Client(GMBD.sock, name, private=True)
        self.addCleanup(c.close)
        return c

    def filled(self, c, size, byte):
        p = c.malloc_peers(size, 0, (), tag="obj")
        ctypes.memset(p, byte, size)
        return p

    def test_a_version_is_read_by_another_process_and_a_write_faults(self):
        c = self.client("pub")
        p = self.filled(c, 4 * MiB, 0x5A)
        ctypes.memmove(p + 10, b"hello", 5)
        v = c.object_publish("py1", p, b"desc")
        self.addCleanup(c.object_drop, "py1")
        self.assertEqual(v, 1)
        self.assertEqual(ctypes.string_at(p + 10, 5), b"hello", "still readable here")
        with self.assertRaises(gmb.GmbError) as e:
            c.free(p)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        self.assertIn("gmb_object_close", str(e.exception))
        rc, out, err = child(
            "p, info, meta = c.object_open('py1')\n"
            "print(info['version'], info['size'], info['device'], info['owner_uid'], meta)\n"
            "print(ctypes.string_at(p + 8, 8))\n"
            "c.object_close(p)\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines(),
                         [f"1 {4 * MiB} 0 {os.getuid()} b'desc'", r"b'ZZhelloZ'"])
        rc, out, err = child("p, info, meta = c.object_open('py1', 1)\n"
                             "ctypes.memset(p, 1, 1)\nprint('wrote')\n")
        self.assertEqual(rc, -signal.SIGSEGV, (out, err))
        self.assertNotIn("wrote", out)
        self.assertEqual(ctypes.string_at(p, 2), b"ZZ", "the write never landed")
        c.object_close(p)
        with self.assertRaises(gmb.GmbError) as e:
            c.object_close(p)
        self.assertEqual(e.exception.errno, errno.ENXIO)

    def test_latest_versions_drops_and_refusals(self):
        c, r = self.client("pub2"), self.client("reader2")
        p1 = self.filled(c, 2 * MiB, 1)
        self.assertEqual(c.object_publish("py2", p1), 1)
        q1, info, meta = r.object_open("py2")
        self.assertEqual((info["version"], meta), (1, b""))
        p2 = self.filled(c, 2 * MiB, 2)
        self.assertEqual(c.object_publish("py2", p2, b"m" * 100), 2)
        q2, info, meta = r.object_open("py2")
        self.assertEqual((info["version"], meta), (2, b"m" * 100))
        self.assertEqual(ctypes.string_at(q1, 1), b"\x01", "a reader keeps its version")
        self.assertEqual(ctypes.string_at(q2, 1), b"\x02")
        self.assertEqual(r.object_open("py2", 1)[0], q1, "mapped once, counted")
        r.object_close(q1)
        r.object_close(q1)
        c.object_close(p1)
        with self.assertRaises(gmb.GmbError) as e:
            r.object_open("py2", 1)
        self.assertEqual(e.exception.errno, errno.ENOENT)
        c.object_drop("py2")
        with self.assertRaises(gmb.GmbError) as e:
            r.object_open("py2")
        self.assertEqual(e.exception.errno, errno.ENOENT)
        self.assertEqual(ctypes.string_at(q2, 1), b"\x02", "open ones stay after a drop")
        r.object_close(q2)
        c.object_close(p2)
        for bad in ("", "a b", "x" * 65, "1/2/3"):
            with self.assertRaises(gmb.GmbError) as e:
                r.object_open(bad)
            self.assertEqual(e.exception.errno, errno.EINVAL, bad)
        p3 = self.filled(c, 2 * MiB, 3)
        with self.assertRaises(gmb.GmbError) as e:
            c.object_publish("py3", p3, b"x" * (c.OBJECT_META_MAX + 1))
        self.assertEqual(e.exception.errno, errno.E2BIG)
        c.free(p3)  # refused publishes leave the allocation the client's
        with self.assertRaises(gmb.GmbError) as e:
            c.object_grant("py-none", 4242)
        self.assertEqual(e.exception.errno, errno.ENOENT)

    def test_grants_are_answered(self):
        c = self.client("pub4")
        p = self.filled(c, 2 * MiB, 4)
        c.object_publish("py4", p)
        self.addCleanup(c.object_drop, "py4")
        self.addCleanup(c.object_close, p)
        c.object_grant("py4", 4242)
        c.object_grant("py4", 4242, revoke=True)
        with self.assertRaises(gmb.GmbError) as e:
            c.object_grant("py4", os.getuid())
        self.assertEqual(e.exception.errno, errno.EINVAL)

    def test_pause_unmaps_readers_and_resume_gives_the_bytes_back(self):
        c = self.client("pub5")
        p = self.filled(c, 2 * MiB, 0x5A)
        c.object_publish("py5", p)
        self.addCleanup(c.object_drop, "py5")
        self.addCleanup(c.object_close, p)
        r = reader("py5")
        self.addCleanup(r.close)
        self.assertEqual(r.ask("check 90"), "1")
        c.object_pause("py5")
        self.assertEqual(r.ask("touch"), str(-signal.SIGSEGV), "unmapped, the pointer kept")
        self.assertEqual(touch(p), -signal.SIGSEGV, "the publisher's own open too")
        with self.assertRaises(gmb.GmbError) as e:
            c.object_open("py5")
        self.assertEqual(e.exception.errno, errno.EBUSY)
        c.object_pause("py5")  # paused already: nothing to do
        c.object_resume("py5")
        self.assertEqual(r.ask("check 90"), "1", "the same pointer, the same bytes")
        self.assertEqual(ctypes.string_at(p, 1), b"\x5a")
        self.assertEqual(touch(p, write=True), -signal.SIGSEGV, "still read-only")
        c.object_resume("py5")
        c.object_pause("py5", discard=True)
        c.object_resume("py5")
        self.assertEqual(r.ask("check 0"), "1", "a discarding pause resumes to zeros")
        self.assertEqual(r.ask("quit"), "0")
        for call in (lambda: c.object_pause("py-none"), lambda: c.object_resume("py-none")):
            with self.assertRaises(gmb.GmbError) as e:
                call()
            self.assertEqual(e.exception.errno, errno.ENOENT)
        with self.assertRaises(gmb.GmbError) as e:
            c.object_pause("a b")
        self.assertEqual(e.exception.errno, errno.EINVAL)


def touch(ptr, write=False):
    """A forked process reads (writes) one byte at ptr: 0, or minus the signal it died of."""
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        if write:
            ctypes.memset(ptr, 1, 1)
        else:
            ctypes.string_at(ptr, 1)
        os._exit(0)
    st = os.waitpid(pid, 0)[1]
    return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)


class reader:
    """A process of its own with NAME's latest open, answering a line per command:
    "check B" (1 when every byte is B), "touch" (what touch() of its pointer gives),
    "quit" (closes; the status)."""

    CODE = """
import ctypes, os, signal, sys
def touch(ptr):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        ctypes.string_at(ptr, 1)
        os._exit(0)
    st = os.waitpid(pid, 0)[1]
    return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)
p, info, meta = c.object_open(sys.argv[1])
size = info["size"]
print(p, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "check":
        print(int(ctypes.string_at(p, size) == bytes([int(cmd[1])]) * size), flush=True)
    elif cmd[0] == "touch":
        print(touch(p), flush=True)
    elif cmd[0] == "quit":
        c.object_close(p)
        print(0, flush=True)
        break
"""

    def __init__(self, name):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
        pre = f"import gmb\nc = gmb.Client({GMBD.sock!r}, 'reader', private=True)\n"
        self.proc = subprocess.Popen([sys.executable, "-c", pre + self.CODE, name], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ptr = int(self.proc.stdout.readline())

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class Layout(unittest.TestCase):
    def test_tensors_go_back_to_back_at_multiples_of_256(self):
        offs, total = objects.layout([("a", 10), ("b", 256), ("c", 0), ("d", 1)])
        self.assertEqual(offs, {"a": 0, "b": 256, "c": 512, "d": 512})
        self.assertEqual(total, 513)
        self.assertEqual(objects.layout([]), ({}, 0))
        offs, total = objects.layout([("x", 3), ("y", 3)], align=8)
        self.assertEqual((offs, total), ({"x": 0, "y": 8}, 11))
        with self.assertRaises(ValueError):
            objects.layout([("a", 1), ("a", 2)])
        with self.assertRaises(ValueError):
            objects.layout([("a", -1)])

    def test_the_description_round_trips_and_is_checked(self):
        desc = {"w": [0, "float16", [4, 8]], "b": [256, "int64", []], "e": [512, "uint8", [0]]}
        blob = objects.encode_description(desc)
        self.assertEqual(json.loads(zlib.decompress(blob)), desc, "zlib of the JSON")
        self.assertEqual(objects.decode_description(blob), desc)
        sizes = {"float16": 2, "int64": 8, "uint8": 1}
        objects.check_description(desc, 512, sizes.__getitem__)
        with self.assertRaises(ValueError):
            objects.check_description(desc, 263, sizes.__getitem__)
        for bad in (b"not zlib", zlib.compress(b"[1]"), zlib.compress(b"{\"w\": [0, 1, []]}"),
                    zlib.compress(b"{\"w\": [-1, \"f\", []]}"),
                    zlib.compress(b"{\"w\": [0, \"f\", [true]]}"), zlib.compress(b"\xff")):
            with self.assertRaises(ValueError, msg=bad):
                objects.decode_description(bad)

    def test_a_description_past_48_kib_is_refused_before_any_allocation(self):
        import random
        rnd = random.Random(1)
        desc = {f"t{rnd.getrandbits(64):x}{i}": [i * 256, "float32", [rnd.getrandbits(20)]]
                for i in range(4000)}
        with self.assertRaises(ValueError):
            objects.encode_description(desc)

    def test_importing_the_module_needs_no_torch(self):
        rc, out, err = child("import sys, gmb.objects\nprint('torch' in sys.modules)\n")
        self.assertEqual((rc, out.strip()), (0, "False"), err)


if __name__ == "__main__":
    unittest.main()
