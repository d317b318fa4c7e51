#!/usr/bin/env bash
# run.sh - the benchmark of issue 3 on the GPU machine: builds (unless
# GMB_GPU_SKIP_BUILD=1), starts build-gpu/gmbd --backend cuda on a temp
# socket with its defaults ($GMB_SOCKET) and a second one with --pool-keep
# unlimited on another ($GMB_SOCKET_WARM: the warm rows and goals), runs
# build-gpu/vmm_bench (arguments are passed on: --quick, --cycles N,
# --cycles-64 N, --no-preserve-64, --no-xproc), stops both gmbds and prints
# the bench's summary (tables, ratios, goals by mode) last.
#
# Logs go to $OUT when set, else build-gpu/out: bench.log (everything,
# both gmbds' logs included) and bench-table.txt (the summary).
# Exit: the bench's status (0 when it ran; goals may still MISS), 1 when
# the build or either gmbd failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

B=${GPU_BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/bench.log
TABLE=$OUTDIR/bench-table.txt

# shellcheck source=tests/gpu/lib.sh
. tests/gpu/lib.sh

TMPD=$(mktemp -d /tmp/gmb-bench.XXXXXX)
SOCK=$TMPD/gmbd.sock
DLOG=$TMPD/gmbd.log
SOCKW=$TMPD/gmbd-warm.sock
DLOGW=$TMPD/gmbd-warm.log
trap 'gmbd_stop_all; rm -rf "$TMPD"' EXIT

: >"$LOG"
{
	echo "gmbd bench: bench/run.sh $*"
	machine_info
} >>"$LOG"

if [ "${GMB_GPU_SKIP_BUILD:-0}" != 1 ]; then
	echo "==== build: tests/gpu/build.sh" >>"$LOG"
	if ! timeout 600 tests/gpu/build.sh >>"$LOG" 2>&1; then
		tail -n 30 "$LOG"
		echo "bench/run.sh: build failed (see $LOG)"
		exit 1
	fi
fi

if ! gmbd_start "$SOCK" "$DLOG"; then
	append_daemon_log "gmbd log" "$DLOG"
	tail -n 30 "$LOG"
	echo "bench/run.sh: gmbd did not start (see $LOG)"
	exit 1
fi
export GMB_SOCKET=$SOCK GMBD_PID=$GMBD_STARTED_PID
# vmm_bench's gmb_malloc calls pack as the allocation hooks do for PyTorch's
# segments (GMB_PACK=hooks is the default, which leaves plain calls alone).
export GMB_PACK=${GMB_PACK:-all}
# The warm gmbd: free memory kept in its pool, so a pause keeps the chunks.
if ! gmbd_start "$SOCKW" "$DLOGW" --pool-keep unlimited; then
	append_daemon_log "gmbd (warm) log" "$DLOGW"
	tail -n 30 "$LOG"
	echo "bench/run.sh: gmbd --pool-keep unlimited did not start (see $LOG)"
	exit 1
fi
export GMB_SOCKET_WARM=$SOCKW
GMBD_WARM_PID=$GMBD_STARTED_PID

echo "==== $B/vmm_bench $* ($(date -u +%T))" >>"$LOG"
t0=$SECONDS
timeout -k 10 "${BENCH_TIMEOUT:-540}" "$B/vmm_bench" "$@" >"$TMPD/bench.out" 2>&1
rc=$?
cat "$TMPD/bench.out" >>"$LOG"
echo "==== vmm_bench: exit $rc after $((SECONDS - t0)) s" >>"$LOG"
gmbd_stop "$GMBD_PID" || echo "gmbd did not stop cleanly" >>"$LOG"
gmbd_stop "$GMBD_WARM_PID" || echo "gmbd (warm) did not stop cleanly" >>"$LOG"
append_daemon_log "gmbd log" "$DLOG"
append_daemon_log "gmbd (warm) log" "$DLOGW"

{
	echo "command: bench/run.sh $*"
	machine_info
	if grep -aq '^==== SUMMARY' "$TMPD/bench.out"; then
		sed -n '/^==== SUMMARY/,$p' "$TMPD/bench.out"
	else
		echo "no summary: vmm_bench exited $rc$([ "$rc" = 124 ] && echo ' (timed out)'); its last lines:"
		tail -n 20 "$TMPD/bench.out"
	fi
} >"$TABLE"
# The progress lines first (they hold the per-shape numbers), the summary last.
sed '/^==== SUMMARY/,$d' "$TMPD/bench.out" | tail -n 40
cat "$TABLE"
exit "$rc"
