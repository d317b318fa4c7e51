"""Where gmb looks for libgmb, and what it says when it finds none."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, "..", "..", "client", "python"))


def _load(env_extra):
    env = dict(os.environ, PYTHONPATH=PYDIR, **env_extra)
    code = "import gmb._lib as l\ntry:\n    l.lib()\nexcept OSError as e:\n    print(e)\n"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60).stdout


class LibLoad(unittest.TestCase):
    def test_missing_library_names_the_install_and_the_variable(self):
        out = _load({"GMB_LIB": "/nonexistent/libgmb.so.0"})
        self.assertIn("make install", out)
        self.assertIn("GMB_LIB to the path of libgmb.so.0", out)
        self.assertIn("/nonexistent/libgmb.so.0 (absent)", out)
        self.assertNotIn("build/libgmb.so.", out)

    def test_gmb_lib_is_loaded_when_set(self):
        lib = os.environ.get("GMB_LIB")
        if not lib:
            self.skipTest("GMB_LIB not set (make check sets it)")
        self.assertEqual(_load({"GMB_LIB": lib}), "")


if __name__ == "__main__":
    unittest.main()
