#!/usr/bin/env bash
# check_pip.sh - `pip install ./client/python` into a fresh venv
# (python3 -m venv) with no network: in a network namespace of its own
# where unshare(1) can make one, and never asking an index. Twice: with
# build isolation (setuptools and wheel from Debian's /usr/share/python-wheels)
# and with --no-build-isolation. Then the module's tests run against the
# installed package (a copy of tests/python outside the source tree, so
# nothing imports client/python) and the build tree's gmbd and libgmb;
# pip uninstall removes it. Last, the README's lines that install the
# stand-in package client/python-tms, run exactly as written (HOME a
# folder of the check's). Run by `make check-pip` (no root needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK=check-pip
. tests/install/lib.sh

PY=${PYTHON:-$(${MAKE:-make} --no-print-directory -s print-PYTHON)}
VERSION=$(sed -n 's/^#define GMB_VERSION "\(.*\)"/\1/p' include/gmb.h)
WHEELS=/usr/share/python-wheels
venv=$T/venv

# No pip configuration of this machine's (indexes, find-links, proxies).
for v in $(compgen -e); do
	case $v in PIP_* | *_proxy | *_PROXY) unset "$v" ;; esac
done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
offline=()
if unshare -n true 2>/dev/null; then offline=(unshare -n)
elif unshare -rn true 2>/dev/null; then offline=(unshare -rn)
else echo "$CHECK: note: unshare cannot make a network namespace here; relying on --no-index"; fi

"$PY" -m venv "$venv" || fail "$PY -m venv (Debian: python3-venv)"
ls "$WHEELS"/setuptools-*.whl "$WHEELS"/wheel-*.whl > /dev/null ||
	fail "no setuptools or wheel in $WHEELS (Debian: python3-venv, python3-wheel-whl)"
# pip builds in the source folder; leave it as it was.
trap 'rm -rf client/python/build client/python/gmb.egg-info client/python-tms/build \
	client/python-tms/torch_memory_saver.egg-info; lib_cleanup' EXIT

pip_install() {
	"${offline[@]}" "$venv/bin/pip" install -q --no-index "$@" > "$T/pip.log" 2>&1 ||
		{ cat "$T/pip.log"; fail "pip install $*"; }
}
pip_install --find-links "$WHEELS" ./client/python
[ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gmb"))')" = "$VERSION" ] ||
	fail "the installed gmb's version is not gmb.h's $VERSION"
pip_install --find-links "$WHEELS" wheel
pip_install --no-build-isolation --force-reinstall ./client/python

# The installed package, not the source tree, and pure Python.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
(cd "$T" && "$venv/bin/python" -c '
import sys, gmb, gmb.torch_memory_saver
assert gmb.__file__.startswith(sys.argv[1] + "/gmb/"), gmb.__file__
' "$site") || fail "import gmb in the venv"
if find "$site/gmb" -name '*.so' | grep . > /dev/null; then fail "the package ships a native library"; fi

mkdir -p "$T/src/tests/python"
cp tests/python/test_gmb.py "$T/src/tests/python/"
(cd "$T" && GMB_BUILD_DIR=$OLDPWD/build GMB_LIB=$OLDPWD/build/libgmb.so \
	"$venv/bin/python" -m unittest discover -s "$T/src/tests/python" -p 'test_*.py') \
	> "$T/unittest.log" 2>&1 || { tail -30 "$T/unittest.log"; fail "the module's tests in the venv"; }
tail -3 "$T/unittest.log" | grep -q '^OK' || { tail -30 "$T/unittest.log"; fail "the module's tests in the venv"; }

"$venv/bin/pip" uninstall -q -y gmb || fail "pip uninstall gmb"
if (cd "$T" && "$venv/bin/python" -c 'import gmb' 2>/dev/null); then fail "gmb still importable after pip uninstall"; fi
# The README's ```sh block that installs client/python-tms, line for line.
readme_block() {
	awk -v pat="$1" '/^```sh$/ { inb = 1; buf = ""; next }
		/^```$/ { if (inb && index(buf, pat)) printf "%s", buf; inb = 0; next }
		inb { buf = buf $0 "\n" }' README.md
}
block=$(readme_block 'pip install --no-index --find-links /usr/share/python-wheels ./client/python-tms')
[ -n "$block" ] || fail "README.md has no sh block that installs ./client/python-tms offline"
mkdir -p "$T/home"
HOME=$T/home "${offline[@]}" bash -eo pipefail -c "$block" > "$T/tms.log" 2>&1 ||
	{ cat "$T/tms.log"; fail "the README's lines for client/python-tms"; }
grep -qx "$T/home/venv/lib/python3[.0-9]*/site-packages/torch_memory_saver/__init__.py" "$T/tms.log" ||
	{ cat "$T/tms.log"; fail "the README's lines did not install torch_memory_saver into ~/venv"; }

echo "$CHECK: PASS (offline pip install into a fresh venv, both ways; $(grep -o 'Ran [0-9]* tests' "$T/unittest.log") there; the README's python-tms lines)"
