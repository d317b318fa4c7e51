"""The torch_memory_saver stand-in package (client/python-tms) without torch or gmbd.

Run by `make check` with the rest of tests/python. What is checked: every
module path torch_memory_saver's users and tests import resolves to the
drop-in's one singleton, its environment variables are parsed as
torch_memory_saver parses them, region arguments are refused before torch is
needed, configure_subprocess edits LD_PRELOAD as torch_memory_saver's does,
the C symbols are found in libgmb and then in the process, and pip installs
the package from the repository.
"""

import errno
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("GMB_BUILD_DIR", "build"))
STANDIN = os.path.join(ROOT, "client", "python-tms")
os.environ.setdefault("GMB_LIB", os.path.join(BUILD, "libgmb.so"))
for p in (STANDIN, os.path.join(ROOT, "client", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

import gmb  # noqa: E402
import gmb.torch_memory_saver as gtms  # noqa: E402
import torch_memory_saver  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None
# What torch_memory_saver's tests and users import, by module.
IMPORTS = {
    "torch_memory_saver": ["torch_memory_saver", "TorchMemorySaver", "configure_subprocess"],
    "torch_memory_saver.entrypoint": ["TorchMemorySaver", "CpuBackupBackend", "is_xpu"],
    "torch_memory_saver.utils": ["change_env", "is_xpu", "get_binary_path_from_package"],
    "torch_memory_saver.testing_utils": ["get_device", "empty_cache", "get_and_print_gpu_memory",
                                         "is_xpu"],
    "torch_memory_saver.hooks.base": ["HookUtilBase", "HookMode"],
    "torch_memory_saver.hooks.mode_preload": ["configure_subprocess", "HookUtilModePreload"],
    "torch_memory_saver.hooks.mode_torch": ["HookUtilModeTorch"],
    "torch_memory_saver.binary_wrapper": ["BinaryWrapper"],
}


class ModulePaths(unittest.TestCase):
    def test_every_imported_name_resolves(self):
        for mod, names in IMPORTS.items():
            m = importlib.import_module(mod)
            for n in names:
                self.assertTrue(hasattr(m, n), f"{mod}.{n}")

    def test_one_singleton_whichever_name_imports_it(self):
        from torch_memory_saver.entrypoint import torch_memory_saver as via_entry

        self.assertIs(torch_memory_saver.torch_memory_saver, gtms.torch_memory_saver)
        self.assertIs(via_entry, gtms.torch_memory_saver)
        self.assertIs(torch_memory_saver.TorchMemorySaver, gtms.TorchMemorySaver)
        self.assertEqual(Path(torch_memory_saver.__file__).parent.parent, Path(STANDIN))

    def test_helpers_work_without_torch(self):
        from torch_memory_saver.testing_utils import get_device
        from torch_memory_saver.utils import is_xpu

        if not HAS_TORCH:
            self.assertFalse(is_xpu())
            self.assertEqual(get_device(), "cuda")
        with self.assertRaises(ValueError):
            from torch_memory_saver.hooks.base import HookUtilBase

            HookUtilBase.create("cuda")

    def test_binaries_are_gmbs(self):
        from torch_memory_saver.utils import get_binary_path_from_package as path

        self.assertEqual(str(path("torch_memory_saver_hook_mode_preload")), gmb.preload_path())
        self.assertEqual(str(path("torch_memory_saver_hook_mode_torch")), gmb.library_path())
        with self.assertRaises(RuntimeError):
            path("torch_memory_saver_hook_mode_cuda13")


class ChangeEnv(unittest.TestCase):
    KEY = "TMS_TEST_CHANGE_ENV"

    def test_absent_key_is_absent_again(self):
        from torch_memory_saver.utils import change_env

        os.environ.pop(self.KEY, None)
        with change_env(self.KEY, "1"):
            self.assertEqual(os.environ[self.KEY], "1")
        self.assertNotIn(self.KEY, os.environ)

    def test_previous_value_is_restored_and_a_change_inside_is_caught(self):
        from torch_memory_saver.utils import change_env

        os.environ[self.KEY] = "old"
        self.addCleanup(os.environ.pop, self.KEY, None)
        with change_env(self.KEY, "1"):
            pass
        self.assertEqual(os.environ[self.KEY], "old")
        with self.assertRaises(AssertionError):
            with change_env(self.KEY, "1"):
                os.environ[self.KEY] = "2"


class ConfigureSubprocess(unittest.TestCase):
    FAKE = "/fake/libgmb_preload.so"

    def invoke(self, initial):
        from torch_memory_saver.hooks import mode_preload

        env = {} if initial is None else {"LD_PRELOAD": initial}
        with mock.patch.dict(os.environ, env):
            if initial is None:
                os.environ.pop("LD_PRELOAD", None)
            with mock.patch.object(mode_preload, "get_binary_path_from_package",
                                   return_value=self.FAKE):
                with torch_memory_saver.configure_subprocess():
                    inside = os.environ.get("LD_PRELOAD", ""), os.environ.get("GMB_LIB")
            after = os.environ.get("LD_PRELOAD")
        return inside, after

    def test_unset_becomes_the_shim_then_unset_again(self):
        (inside, lib), after = self.invoke(None)
        self.assertEqual(inside, self.FAKE)
        self.assertEqual(lib, gmb.library_path(), "children find this libgmb")
        self.assertIsNone(after)

    def test_the_shim_goes_first_and_the_rest_stays(self):
        (inside, _), after = self.invoke("/other/lib.so")
        self.assertEqual(inside.split(":"), [self.FAKE, "/other/lib.so"])
        self.assertEqual(after, "/other/lib.so")

    def test_gmb_lib_is_restored(self):
        with mock.patch.dict(os.environ, {"GMB_LIB": os.environ["GMB_LIB"]}):
            before = os.environ["GMB_LIB"]
            with gtms.configure_subprocess():
                self.assertEqual(os.environ["LD_PRELOAD"].split(":")[0], gmb.preload_path())
            self.assertEqual(os.environ["GMB_LIB"], before)


class EnvParsing(unittest.TestCase):
    def test_defaults(self):
        self.assertEqual(gtms.tms_config_from_env({}), {
            "enable": False, "cpu_backup": False, "disk_backup": False, "backend": "pinned",
            "retain": False, "disk_dir": "/tmp"})

    def test_booleans_are_the_peers_spellings_only(self):
        for v in ("1", "true", "TRUE", "yes", "YES"):
            self.assertTrue(gtms.tms_config_from_env({"TMS_INIT_ENABLE": v})["enable"], v)
        for v in ("0", "", "True", "on", "2", "y"):
            self.assertFalse(gtms.tms_config_from_env({"TMS_RETAIN_CPU_BACKUP": v})["retain"], v)

    def test_backend_and_folder(self):
        cfg = gtms.tms_config_from_env({"TMS_INIT_ENABLE_CPU_BACKUP": "1",
                                        "TMS_INIT_CPU_BACKUP_BACKEND": "mmap",
                                        "TMS_DISK_BACKUP_DIR": "/var/tmp/x"})
        self.assertEqual((cfg["cpu_backup"], cfg["backend"], cfg["disk_dir"]),
                         (True, "mmap", "/var/tmp/x"))
        self.assertEqual(gtms.tms_config_from_env({"TMS_INIT_CPU_BACKUP_BACKEND": ""})["backend"],
                         "pinned")

    def test_bad_values_are_refused(self):
        with self.assertRaisesRegex(ValueError, "TMS_INIT_CPU_BACKUP_BACKEND"):
            gtms.tms_config_from_env({"TMS_INIT_CPU_BACKUP_BACKEND": "cuda"})
        with self.assertRaisesRegex(ValueError, "mutually exclusive"):
            gtms.tms_config_from_env({"TMS_INIT_ENABLE_CPU_BACKUP": "1",
                                      "TMS_INIT_ENABLE_DISK_BACKUP": "yes"})


class Arguments(unittest.TestCase):
    def test_resolution(self):
        r = gtms._resolve_backup
        self.assertEqual(r(False, False, None), ("discard", gtms.BACKUP_DEFAULT))
        self.assertEqual(r(True, False, None), ("preserve", gtms.BACKUP_DEFAULT))
        self.assertEqual(r(True, False, "pinned"), ("preserve", gtms.BACKUP_PINNED))
        self.assertEqual(r(True, False, "mmap"), ("preserve", gtms.BACKUP_MMAP))
        self.assertEqual(r(False, True, None), ("preserve", gtms.BACKUP_DISK))

    def test_refused_before_torch_is_needed(self):
        saver = gtms.TorchMemorySaver()
        bad = [dict(cpu_backup_backend="mmap"),  # the peer: "requires enable_cpu_backup"
               dict(enable_cpu_backup=True, cpu_backup_backend="cuda"),
               dict(enable_cpu_backup=True, enable_disk_backup=True)]
        for kw in bad:
            with self.assertRaises(ValueError, msg=kw):
                with saver.region(**kw):
                    pass
        with self.assertRaisesRegex(ValueError, "requires enable_cpu_backup"):
            with saver.cuda_graph(None, cpu_backup_backend="pinned"):
                pass
        self.assertIsNone(saver._impl, "nothing was initialised")

    @unittest.skipIf(HAS_TORCH, "torch is installed: the region would start")
    def test_a_valid_region_needs_torch(self):
        with self.assertRaises(ImportError):
            with gtms.TorchMemorySaver().region("w", enable_disk_backup=True):
                pass


class CSide(unittest.TestCase):
    """What libgmb offers; the expectations follow what this libgmb has."""

    def test_retain_cpu_backup(self):
        saver = gtms.TorchMemorySaver()
        if gtms._opt("gmb_set_retain_host_copy") is None:
            self.assertTrue(saver.retain_cpu_backup, "an older libgmb keeps host copies")
            saver.retain_cpu_backup = True
            with self.assertRaises(gmb.GmbError) as e:
                saver.retain_cpu_backup = False
            self.assertEqual(e.exception.errno, errno.ENOSYS)
            self.assertIn("gmb_set_retain_host_copy", e.exception.strerror)
            return
        self.assertFalse(saver.retain_cpu_backup, "torch_memory_saver's default")
        saver.retain_cpu_backup = True
        try:
            self.assertTrue(saver.retain_cpu_backup)
        finally:
            saver.retain_cpu_backup = False
        self.assertFalse(saver.retain_cpu_backup)

    def test_disk_backup_dir(self):
        d = tempfile.mkdtemp(prefix="tmsdisk.")
        self.addCleanup(shutil.rmtree, d, True)
        target = os.path.join(d, "sub")
        saver = gtms.TorchMemorySaver()
        if gtms._opt("gmb_set_disk_dir") is None:
            with self.assertRaises(gmb.GmbError) as e:
                saver.set_disk_backup_dir(target)
            self.assertEqual(e.exception.errno, errno.ENOSYS)
        else:
            saver.set_disk_backup_dir(target)
        self.assertTrue(os.path.isdir(target), "created first, as torch_memory_saver does")

    def test_default_backend(self):
        self.assertIn(gtms.default_backend(), ("pinned", "mmap"))

    def test_symbols_come_from_libgmb_then_the_process(self):
        cdll = gtms.BinaryWrapper().cdll
        self.assertIs(cdll.gmb_library_path, cdll.gmb_library_path, "bound once")
        self.assertTrue(hasattr(cdll, "getpid"), "the process's C library")
        self.assertFalse(hasattr(cdll, "tms_xpu_committed_bytes"))
        if hasattr(cdll, "tms_get_cpu_backup_backend"):
            self.assertIn(cdll.tms_get_cpu_backup_backend(), (b"pinned", b"mmap"))
            self.assertEqual(cdll.tms_get_current_tag(), b"default")
            self.assertFalse(cdll.tms_get_interesting_region())


def _pip():
    """A python3 that can build wheels offline: (python, reason it cannot)."""
    for py in (sys.executable, "/usr/bin/python3"):
        if not shutil.which(py) and not os.path.exists(py):
            continue
        probe = ("import importlib.util as u, sys; "
                 "sys.exit(0 if all(u.find_spec(m) for m in ('pip', 'setuptools', 'wheel')) else 1)")
        if subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
            return py
    return None


class PipInstall(unittest.TestCase):
    @unittest.skipIf(_pip() is None, "no python3 with pip, setuptools and wheel")
    def test_installs_offline_and_imports_from_the_target(self):
        target = tempfile.mkdtemp(prefix="tmspip.")
        self.addCleanup(shutil.rmtree, target, True)
        work = tempfile.mkdtemp(prefix="tmssrc.")
        self.addCleanup(shutil.rmtree, work, True)
        p = subprocess.run([_pip(), "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                            "--no-index", "--quiet", "--target", target, STANDIN],
                           capture_output=True, text=True, timeout=300, cwd=work,
                           env=dict(os.environ, PIP_NO_CACHE_DIR="1"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # The build folder pip leaves in the source tree is not the package's.
        shutil.rmtree(os.path.join(STANDIN, "build"), ignore_errors=True)
        for egg in Path(STANDIN).glob("*.egg-info"):
            shutil.rmtree(egg, ignore_errors=True)
        code = ("import torch_memory_saver, gmb, gmb.torch_memory_saver as g\n"
                "from torch_memory_saver.utils import change_env\n"
                "assert torch_memory_saver.torch_memory_saver is g.torch_memory_saver\n"
                "print(torch_memory_saver.__file__, gmb.__file__)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=target), cwd=work, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(all(f.startswith(target) for f in out.stdout.split()), out.stdout)


if __name__ == "__main__":
    unittest.main()
