#!/usr/bin/env bash
# check_examples.sh - examples/ as the README shows them: the C example
# built with -Iinclude ... -Lbuild -lgmb (make: build/examples/pause_resume)
# and with the build tree's pkg-config file, run with LD_LIBRARY_PATH=build;
# the Python example with PYTHONPATH=client/python and GMB_LIB. Both
# against a real gmbd with its default host device, and both must fail
# with exit status 1 and a reason when gmbd is missing or its budget is
# too small. Run by `make check-examples` (no root needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK=check-examples
. tests/install/lib.sh

PY=${PYTHON:-$(${MAKE:-make} --no-print-directory -s print-PYTHON)}
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -std=gnu11 -Wall -Wextra -Werror -o "$T/pause_resume" examples/pause_resume.c \
	$(PKG_CONFIG_PATH=build pkg-config --cflags --libs gmb) || fail "cc with PKG_CONFIG_PATH=build pkg-config"
export LD_LIBRARY_PATH=$PWD/build PYTHONPATH=$PWD/client/python GMB_LIB=$PWD/build/libgmb.so \
	PYTHONDONTWRITEBYTECODE=1

# run WANT_RC LOG CMD...: CMD's exit status must be WANT_RC.
run() {
	local want=$1 log=$2 rc=0
	shift 2
	"$@" > "$log" 2>&1 || rc=$?
	[ "$rc" = "$want" ] || { cat "$log"; fail "$* exited with $rc, not $want"; }
}

# No gmbd: a reason, exit status 1.
export GMB_SOCKET=$T/none.sock GMB_RECONNECT=0
run 1 "$T/c.out" build/examples/pause_resume
grep -q 'cannot connect to gmbd' "$T/c.out" || fail "C example without gmbd: $(cat "$T/c.out")"
run 1 "$T/py.out" "$PY" examples/pause_resume.py
grep -q '^pause_resume.py: ' "$T/py.out" || fail "Python example without gmbd: $(cat "$T/py.out")"

# gmbd --backend host with its defaults: one device of 8 GiB.
gmbd_start build/gmbd "$T/gmbd.sock"
export GMB_SOCKET=$T/gmbd.sock
for prog in build/examples/pause_resume "$T/pause_resume"; do
	run 0 "$T/c.out" "$prog"
	grep -q '^paused:' "$T/c.out" && grep -q '^resumed: weights at 0x' "$T/c.out" ||
		fail "$prog: $(cat "$T/c.out")"
	grep -q 'pause-resume-example' "$T/c.out" || fail "$prog: the status while paused does not list it"
done
run 0 "$T/py.out" "$PY" examples/pause_resume.py
grep -qx "paused: {'weights': 'paused', 'kv': 'paused'}" "$T/py.out" &&
	grep -q "^resumed: {'weights': 'active', 'kv': 'active'} weights at 0x" "$T/py.out" ||
	fail "Python example: $(cat "$T/py.out")"
kill "$GMBD_PID" && wait "$GMBD_PID" || true
GMBD_PID=

# A budget too small for the example: gmbd's sentence, exit status 1.
gmbd_start build/gmbd "$T/small.sock" --host-memory 512MiB
export GMB_SOCKET=$T/small.sock
run 1 "$T/c.out" build/examples/pause_resume
grep -q 'gmb_malloc kv: .*budget' "$T/c.out" || fail "C example over budget: $(cat "$T/c.out")"
run 1 "$T/py.out" "$PY" examples/pause_resume.py
grep -q '^pause_resume.py: .*budget' "$T/py.out" || fail "Python example over budget: $(cat "$T/py.out")"
echo "$CHECK: PASS (C example built both ways, Python example; with gmbd, without, over budget)"
