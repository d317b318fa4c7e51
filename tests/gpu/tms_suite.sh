#!/usr/bin/env bash
# tms_suite.sh - torch_memory_saver's own test suite, unchanged, on gmbd.
#
#   tests/gpu/tms_suite.sh [--no-build] [-k PYTEST_EXPR]
#   tests/gpu/tms_suite.sh [--no-build] --script FILE.py [ARGS...]
#       instead of the suite: PyTorch's python runs FILE.py with the same
#       environment and gmbd; its own "RESULT:" line is the verdict
#       (tests/gpu/sglang_flow.py, tests/gpu/tms_bench.py)
#
# Runs test/test_examples.py (over test/examples/*.py) of torch_memory_saver
# at commit 4a43c97 from .peer/torch_memory_saver (an ignored folder carried
# from the build machine; never part of the project) with pytest, against the
# stand-in package client/python-tms (torch_memory_saver -> gmb) on
# PYTHONPATH and a gmbd started with its defaults. The suite parametrizes
# both hook modes itself (preload: its children run under
# configure_subprocess(), i.e. libgmb_preload.so; torch: the pluggable
# allocator). Prints each test's outcome and, last,
# "RESULT: PASS|FAIL - N passed, M failed, K skipped".
#
# Needs: build-gpu/gmbd (tests/gpu/build.sh), libgmb.so and
# libgmb_preload.so (built here through tests/gpu/torch_run.sh's build when
# absent), .gpu-deps (pack-deps.sh, torch-deps.sh, and tms-deps.sh for
# pytest when the venv has none), .peer/torch_memory_saver.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

B=${GPU_BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/tms-suite.log
PEER=$PWD/.peer/torch_memory_saver
DO_BUILD=1 KEXPR="" SCRIPT=""
while [ $# -gt 0 ]; do
	case $1 in
	--no-build) DO_BUILD=0 ;;
	-k) KEXPR=$2; shift ;;
	--script) SCRIPT=$2; shift 2; break ;;
	-h | --help) sed -n '2,25p' "$0"; exit 0 ;;
	*) echo "tms_suite.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

# shellcheck source=tests/gpu/lib.sh
. tests/gpu/lib.sh
TMPD=$(mktemp -d /tmp/gmb-tms.XXXXXX)
trap 'gmbd_stop_all; rm -rf "$TMPD"' EXIT
: >"$LOG"

fail() {
	echo "RESULT: FAIL - $*"
	exit 1
}

[ -f "$PEER/test/test_examples.py" ] || fail "$PEER/test/test_examples.py missing: carry .peer (torch_memory_saver at 4a43c97)"
PY=""
for p in "${TORCH_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
	[ -n "$p" ] && command -v "$p" >/dev/null 2>&1 || continue
	if "$p" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >>"$LOG" 2>&1; then
		PY=$p
		break
	fi
done
[ -n "$PY" ] || fail "no python3 with a CUDA-enabled torch (set TORCH_PYTHON)"

if [ "$DO_BUILD" = 1 ] && { [ ! -x "$B/gmbd" ] || [ ! -f "$B/libgmb.so" ] || [ ! -f "$B/libgmb_preload.so" ]; }; then
	echo "==== build: tests/gpu/torch_run.sh --only build-only" >>"$LOG"
	timeout 900 tests/gpu/torch_run.sh --only build-only >>"$LOG" 2>&1
fi
for f in "$B/gmbd" "$B/gmbctl" "$B/libgmb.so" "$B/libgmb_preload.so"; do
	[ -e "$f" ] || fail "$f missing (build failed? see $LOG)"
done

export LD_LIBRARY_PATH=$PWD/.gpu-deps/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GMB_LIB=$PWD/$B/libgmb.so GMB_PRELOAD_LIB=$PWD/$B/libgmb_preload.so
PP=$PWD/client/python-tms:$PWD/client/python
if ! "$PY" -c 'import pytest' >/dev/null 2>&1; then
	[ -d .gpu-deps/py/pytest ] || fail "no pytest in $PY and no .gpu-deps/py (run tests/gpu/tms-deps.sh on the build machine)"
	PP=$PP:$PWD/.gpu-deps/py
fi
export PYTHONPATH=$PP PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The stand-in, not a torch_memory_saver installed in the venv, must answer.
where=$(cd "$TMPD" && "$PY" -c 'import torch_memory_saver as t; print(t.__file__)' 2>>"$LOG")
case $where in
"$PWD/client/python-tms/"*) ;;
*) fail "import torch_memory_saver gives ${where:-an error} instead of the stand-in (see $LOG)" ;;
esac

SOCK=$TMPD/gmbd.sock
gmbd_start "$SOCK" "$TMPD/gmbd.log" || { append_daemon_log "gmbd log" "$TMPD/gmbd.log"; fail "gmbd did not start (see $LOG)"; }
GPID=$GMBD_STARTED_PID
export GMB_SOCKET=$SOCK

if [ -n "$SCRIPT" ]; then
	# A second gmbd that keeps free memory warm (--pool-keep unlimited), for
	# scripts that compare both ways ($GMB_SOCKET_WARM; tms_bench.py does).
	SOCKW=$TMPD/gmbd-warm.sock
	if gmbd_start "$SOCKW" "$TMPD/gmbd-warm.log" --pool-keep unlimited; then
		export GMB_SOCKET_WARM=$SOCKW
	else
		append_daemon_log "gmbd (warm) log" "$TMPD/gmbd-warm.log"
	fi
	echo "==== $PY $SCRIPT $*" >>"$LOG"
	timeout -k 10 900 "$PY" "$SCRIPT" "$@" 2>&1 | tee -a "$LOG"
	rc=${PIPESTATUS[0]}
	kill -0 "$GPID" 2>/dev/null || { echo "RESULT: FAIL - gmbd died during $SCRIPT"; exit 1; }
	gmbd_stop "$GPID" || echo "gmbd did not stop cleanly" >>"$LOG"
	append_daemon_log "gmbd log" "$TMPD/gmbd.log"
	exit "$rc"
fi

# From test/ (not the peer's root): `import torch_memory_saver` must not find
# the peer's own package, and pytest finds `examples` next to the test file.
echo "==== pytest: $PY -m pytest test_examples.py (torch $("$PY" -c 'import torch; print(torch.__version__)'))" >>"$LOG"
args=(-m pytest test_examples.py -v -rA -p no:cacheprovider)
[ -n "$KEXPR" ] && args+=(-k "$KEXPR")
(cd "$PEER/test" && timeout -k 10 900 "$PY" "${args[@]}") >"$TMPD/pytest.out" 2>&1
rc=$?
cat "$TMPD/pytest.out" >>"$LOG"
GMB_SOCKET=$SOCK timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1
alive=1
kill -0 "$GPID" 2>/dev/null || alive=0
gmbd_stop "$GPID" || echo "gmbd did not stop cleanly" >>"$LOG"
append_daemon_log "gmbd log" "$TMPD/gmbd.log"

# Per test: pytest -rA's short summary lines.
grep -aE '^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) ' "$TMPD/pytest.out" | sed 's/^/[tms] /'
summary=$(grep -aE '^=+ .*(passed|failed|skipped|error).* =+$' "$TMPD/pytest.out" | tail -n 1)
count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
np=$(count passed) nf=$(count failed) ns=$(count skipped) ne=$(count error)
nf=$((nf + ne))
detail="$np passed, $nf failed, $ns skipped (torch_memory_saver 4a43c97 test_examples.py, both hook modes, gmbd defaults)"
[ "$alive" = 1 ] || fail "$detail; gmbd died during the suite"
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
	fail "$detail; pytest timed out"
fi
if [ -z "$summary" ]; then
	tail -n 20 "$TMPD/pytest.out"
	fail "pytest exit $rc without a summary line (see $LOG)"
fi
if [ "$nf" = 0 ] && [ "$np" -gt 0 ] && [ "$rc" = 0 ]; then
	echo "RESULT: PASS - $detail"
	exit 0
fi
echo "RESULT: FAIL - $detail"
exit 1
