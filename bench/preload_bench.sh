#!/usr/bin/env bash
# preload_bench.sh - what libgmb_preload.so adds to cudaMalloc/cudaFree, in
# ns per call: the same program (bench/preload_bench.c) without the shim,
# with it in a process that never loads libgmb, with libgmb loaded but no
# region, and inside a region (packed by default: most calls a piece of a pack).
#
#   bench/preload_bench.sh            the CUDA runtime ($CUDA_HOME/lib64/libcudart.so),
#                                     gmbd --backend cuda; libgmb.so and the shim from
#                                     $GPU_BUILD_DIR (build-gpu: tests/gpu/torch_run.sh)
#   bench/preload_bench.sh --fake     the stand-in runtime tests/fake_cudart.c and
#                                     gmbd --backend host, from build/ (no GPU: the
#                                     numbers are the shim's cost over a runtime that
#                                     costs almost nothing, not a GPU's)
#   GMBD_ARGS="--pool-keep unlimited"  extra options for the gmbd it starts
#   GMBD_LOG_LEVEL=debug               its log level (kept in $OUT/preload-gmbd.log)
#
# Each process also times the runtime's own functions (looked up in its
# handle, past the shim) batch for batch with the calls through the shim:
# "added" is the median difference within one process. Separate processes
# are shown too, but their runtime's own cost moves by more than the shim
# costs (hundreds of ns between two runs on one H200), so they do not judge.
# Prints the table and "RESULT: PASS|FAIL - ..." last: PASS when each
# outside-region case adds under 50 ns per call. Logs to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

FAKE=0
[ "${1:-}" = --fake ] && FAKE=1
CC=${CC:-gcc}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
GOAL_NS=50
ITERS=${PRELOAD_BENCH_ITERS:-200000}
REGION_ITERS=${PRELOAD_BENCH_REGION_ITERS:-500}

if [ "$FAKE" = 1 ]; then
	B=${BUILD_DIR:-build}
	[ -f "$B/tests/libfake_cudart.so" ] && [ -f "$B/libgmb.so" ] && [ -f "$B/libgmb_preload.so" ] ||
		make -j2 "$B/bin" "$B/tests/libfake_cudart.so" >/dev/null || exit 1
	RTDIR=$PWD/$B/tests RTLIB=fake_cudart BACKEND=host RUNTIME="the stand-in runtime (tests/fake_cudart.c)"
else
	B=${GPU_BUILD_DIR:-build-gpu}
	RTDIR=$CUDA_HOME/lib64 RTLIB=cudart BACKEND=cuda RUNTIME="libcudart.so ($CUDA_HOME)"
fi
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR" "$B/bench"
LOG=$OUTDIR/preload-bench.log
for f in "$B/libgmb.so" "$B/libgmb_preload.so" "$B/gmbd"; do
	if [ ! -f "$f" ]; then
		echo "RESULT: FAIL - $f missing (tests/gpu/torch_run.sh builds libgmb.so and the shim)"
		exit 1
	fi
done

BIN=$B/bench/preload_bench
if ! "$CC" -std=gnu11 -O2 -Wall -Wextra -Werror -I"$CUDA_HOME/include" -o "$BIN" bench/preload_bench.c \
	-L"$RTDIR" -l"$RTLIB" -Wl,-rpath,"$RTDIR" -ldl >"$LOG" 2>&1; then
	cat "$LOG"
	echo "RESULT: FAIL - bench/preload_bench.c did not build against $RUNTIME"
	exit 1
fi

TMPD=$(mktemp -d /tmp/gmb-preload-bench.XXXXXX)
SOCK=$TMPD/gmbd.sock
# shellcheck disable=SC2086 # GMBD_ARGS: extra gmbd options, word-split on purpose
"$B/gmbd" --backend "$BACKEND" --socket "$SOCK" --log-level "${GMBD_LOG_LEVEL:-warning}" ${GMBD_ARGS:-} \
	>"$TMPD/gmbd.log" 2>&1 &
GPID=$!
trap 'kill "$GPID" 2>/dev/null; wait "$GPID" 2>/dev/null; cp "$TMPD/gmbd.log" "$OUTDIR/preload-gmbd.log"; rm -rf "$TMPD"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
export GMB_SOCKET=$SOCK GMB_LIB=$PWD/$B/libgmb.so
SHIM=$PWD/$B/libgmb_preload.so

# run NAME [env...] -- args: one measurement line into $NAME's variables.
declare -A MAL FRE DMAL DFRE AMAL AFRE
field() { sed -n "s/.* $1=\\([-0-9.]*\\).*/\\1/p" <<<" $2"; }
run() {
	local name=$1 line
	shift
	line=$(env "$@" 2>>"$LOG") || { echo "$name: failed (see $LOG)" >&2; return 1; }
	echo "$name: $line" >>"$LOG"
	MAL[$name]=$(field malloc_ns "$line")
	FRE[$name]=$(field free_ns "$line")
	DMAL[$name]=$(field direct_malloc_ns "$line")
	DFRE[$name]=$(field direct_free_ns "$line")
	AMAL[$name]=$(field added_malloc_ns "$line")
	AFRE[$name]=$(field added_free_ns "$line")
}

ok=1
run plain "$BIN" --iters "$ITERS" --size 4096 || ok=0
run shim LD_PRELOAD="$SHIM" "$BIN" --iters "$ITERS" --size 4096 || ok=0
run loaded LD_PRELOAD="$SHIM" "$BIN" --iters "$ITERS" --size 4096 --load-gmb || ok=0
run region LD_PRELOAD="$SHIM" "$BIN" --iters "$REGION_ITERS" --size $((2 << 20)) --region bench || ok=0
if [ "$ok" = 0 ]; then
	cat "$LOG" "$TMPD/gmbd.log"
	echo "RESULT: FAIL - a run failed"
	exit 1
fi

add() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f", a - b }'; }
sgn() { awk -v a="$1" 'BEGIN { printf "%+.1f", a }'; }
row() { printf '| %-44s | %10s | %10s | %10s | %10s | %9s | %9s | %9s | %9s |\n' "$@"; }
{
	echo "preload shim cost, $(date -u +%F), against $RUNTIME; ns per call, median of 7 runs"
	echo "(same process: the shim's calls against the runtime's own, batch for batch; other process: against the no-shim run)"
	row case cudaMalloc cudaFree "own M" "own F" "added M" "added F" "other M" "other F"
	for n in plain shim loaded; do
		case $n in
		plain) d="no shim (the method's noise floor)" ;;
		shim) d="shim, outside regions, libgmb never loaded" ;;
		loaded) d="shim, outside regions, libgmb loaded" ;;
		esac
		row "$d" "${MAL[$n]}" "${FRE[$n]}" "${DMAL[$n]}" "${DFRE[$n]}" "$(sgn "${AMAL[$n]}")" \
			"$(sgn "${AFRE[$n]}")" "$(add "${MAL[$n]}" "${MAL[plain]}")" "$(add "${FRE[$n]}" "${FRE[plain]}")"
	done
	row "shim, inside a region (2 MiB from gmbd)" "${MAL[region]}" "${FRE[region]}" - - - - - -
} | tee "$OUTDIR/preload-bench-table.txt"

worst=$(awk -v a="${AMAL[shim]}" -v b="${AFRE[shim]}" -v c="${AMAL[loaded]}" -v d="${AFRE[loaded]}" \
	'BEGIN { w = a; if (b > w) w = b; if (c > w) w = c; if (d > w) w = d; printf "%.1f", w }')
label="$([ "$FAKE" = 1 ] && echo "against the stand-in runtime" || echo "against libcudart"), in one process"
if awk -v w="$worst" -v g="$GOAL_NS" 'BEGIN { exit !(w < g) }'; then
	echo "RESULT: PASS - the shim adds at most $worst ns per call outside regions (goal < $GOAL_NS), $label; inside a region ${MAL[region]} / ${FRE[region]} ns"
else
	echo "RESULT: FAIL - the shim adds $worst ns per call outside regions (goal < $GOAL_NS), $label"
	exit 1
fi
