#!/usr/bin/env bash
# graph_cuts.sh - torch_graph.py under many conditions at once, to tell a
# fault of the broker from one of the captured step; on the GPU machine.
#
#   tests/gpu/graph_cuts.sh [--runs 20] [--budget 300] [--lanes LIST] [--extra "ARGS"]
#                           [--lane "NAME:OPTIONS"]... [--probe] [--initcheck]
#
# Each lane (a set of torch_graph.py options) runs --runs processes one after
# another against a gmbd of its own (so "the same chunks back" holds in the
# --no-trim lane); lanes run in parallel. --probe runs graph_probe.py (which
# kernel varies) first, --initcheck runs compute-sanitizer --tool initcheck
# on one run with the pool in gmbd and one in ordinary memory. --extra adds
# options to every lane. Every lane stops at --budget seconds.
# Logs in $OUT (else build-gpu/out): cuts.log, cuts-summary.txt, probe.log,
# initcheck-{gmbd,ordinary}.log. Builds with tests/gpu/torch_run.sh first.
# The last line is "RESULT: PASS|FAIL - ..." (PASS: every run bit-exact).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

B=${GPU_BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/cuts.log
RUNS=20 BUDGET=300 PROBE=0 INITCHECK=0 EXTRA="" LANES="" CUSTOM=()
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift ;;
	--budget) BUDGET=$2; shift ;;
	--lanes) LANES=",$2,"; shift ;;
	--extra) EXTRA=$2; shift ;;
	--lane) CUSTOM+=("$2"); shift ;;
	--probe) PROBE=1 ;;
	--initcheck) INITCHECK=1 ;;
	-h | --help) sed -n '2,18p' "$0"; exit 0 ;;
	*) echo "graph_cuts.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

# name: torch_graph.py options
ALL_LANES=(
	"global:--capture-mode global"
	"global_notrim:--capture-mode global --no-trim"
	"global_zero:--capture-mode global --graph-mode zero"
	"global_preserve:--capture-mode global --graph-mode preserve"
	"thread_local:--capture-mode thread_local"
	"relaxed:--capture-mode relaxed"
	"global_ordinary:--capture-mode global --pool ordinary"
	"global_sdpa_math:--capture-mode global --sdpa math"
	"global_deterministic:--capture-mode global --deterministic"
)

[ ${#CUSTOM[@]} -gt 0 ] && ALL_LANES=("${CUSTOM[@]}")
: >"$LOG"
if [ ! -x "$B/gmbd" ] || [ ! -f "$B/libgmb.so" ]; then
	OUT=$OUTDIR/build tests/gpu/torch_run.sh --only none >/dev/null 2>&1
	cat "$OUTDIR/build/torch-tests.log" >>"$LOG" 2>/dev/null
	rm -rf "$OUTDIR/build"
fi
[ -x "$B/gmbd" ] && [ -f "$B/libgmb.so" ] || { echo "RESULT: FAIL - build failed (cuts.log)"; exit 1; }

# shellcheck source=tests/gpu/lib.sh
. tests/gpu/lib.sh
PY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
TMPD=$(mktemp -d /tmp/gmb-cuts.XXXXXX)
trap 'gmbd_stop_all; rm -rf "$TMPD"' EXIT
export LD_LIBRARY_PATH=$PWD/.gpu-deps/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/client/python:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
export GMB_LIB=$PWD/$B/libgmb.so GMB_PRELOAD_LIB=$PWD/$B/libgmb_preload.so PYTHONUNBUFFERED=1
SHIM=$GMB_PRELOAD_LIB
T0=$SECONDS

lane() { # lane NAME SOCKET OPTIONS...
	local name=$1 sock=$2 i rc out
	shift 2
	for ((i = 1; i <= RUNS; i++)); do
		if [ $((SECONDS - T0)) -ge "$BUDGET" ]; then
			echo "LANE $name stopped at the budget after $((i - 1)) runs" >>"$TMPD/$name.lane"
			break
		fi
		out=$TMPD/$name.$i.out
		# shellcheck disable=SC2086
		GMB_SOCKET=$sock GMB_CLIENT_NAME=$name timeout -k 5 120 env LD_PRELOAD="$SHIM" "$PY" \
			tests/gpu/torch_graph.py "$@" $EXTRA >"$out" 2>&1
		rc=$?
		{
			echo "==== $name run $i: exit $rc"
			grep -a -v '^tags: ' "$out" | tail -n 12
		} >>"$TMPD/$name.lane"
		grep -a '^CUTSTAT ' "$out" | sed "s/^CUTSTAT /CUTSTAT $name $rc /" >>"$TMPD/stats"
		grep -aq '^CUTSTAT ' "$out" || echo "CUTSTAT $name $rc {}" >>"$TMPD/stats"
	done
}

if [ "$PROBE" = 1 ]; then
	timeout -k 5 240 "$PY" tests/gpu/graph_probe.py --reps 100 >"$OUTDIR/probe.log" 2>&1 &
	PROBE_PID=$!
fi

pids=()
n=0
for l in "${ALL_LANES[@]}"; do
	name=${l%%:*} opts=${l#*:}
	[ -n "$LANES" ] && [[ $LANES != *",$name,"* ]] && continue
	n=$((n + 1))
	sock=$TMPD/gmbd-$n.sock
	gmbd_start "$sock" "$TMPD/gmbd-$n.log" || { echo "gmbd for $name did not start" >>"$LOG"; continue; }
	# shellcheck disable=SC2086
	lane "$name" "$sock" $opts &
	pids+=($!)
done

initcheck() { # initcheck NAME SOCKET OPTIONS...
	local name=$1 sock=$2 cs=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
	shift 2
	[ -x "$cs" ] || cs=$(command -v compute-sanitizer)
	GMB_SOCKET=$sock timeout -k 5 200 "$cs" --tool initcheck --print-limit 30 \
		env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_graph.py "$@" \
		>"$OUTDIR/initcheck-$name.log" 2>&1
	echo "exit $?" >>"$OUTDIR/initcheck-$name.log"
}
if [ "$INITCHECK" = 1 ]; then
	sock=$TMPD/gmbd-ic.sock
	if gmbd_start "$sock" "$TMPD/gmbd-ic.log"; then
		initcheck gmbd "$sock" --replays 2 --cycles 1 &
		pids+=($!)
		initcheck ordinary "$sock" --pool ordinary --replays 2 --cycles 1 &
		pids+=($!)
	fi
fi
wait "${pids[@]}"
[ -n "${PROBE_PID:-}" ] && wait "$PROBE_PID"

for f in "$TMPD"/*.lane; do cat "$f"; done >>"$LOG"
for f in "$TMPD"/gmbd-*.log; do append_daemon_log "$(basename "$f")" "$f"; done
cp "$TMPD/stats" "$OUTDIR/cuts-stats.txt" 2>/dev/null
python3 - "$TMPD/stats" "$((SECONDS - T0))" <<'PYEOF' | tee "$OUTDIR/cuts-summary.txt"
import collections, json, sys
lanes = collections.OrderedDict()
for line in open(sys.argv[1]):
    _, name, rc, js = line.split(" ", 3)
    lanes.setdefault(name, []).append((int(rc), json.loads(js)))
bad_total = 0
print(f"| lane | runs | pass | pre-pause differ | after-resume differ | refs | eager vs ref | diffs |")
print("|---|---|---|---|---|---|---|---|")
for name, runs in lanes.items():
    ok = sum(1 for rc, _ in runs if rc == 0)
    pre = sum(1 for _, s in runs if any(x != "=" for x in s.get("pre", [])))
    post = sum(1 for _, s in runs if any(x != "=" for x in s.get("post", [])))
    refs = collections.Counter(s.get("ref") for _, s in runs)
    eager = sum(1 for _, s in runs if s.get("eager") and any(e != s["ref"] for e in s["eager"]))
    eager_var = sum(1 for _, s in runs if s.get("eager") and len(set(s["eager"])) > 1)
    diffs = [d for _, s in runs for d in s.get("pre_diff", []) + s.get("post_diff", [])]
    dtxt = ", ".join(f"{d['frac'] * 100:.2f}%/{d['max']:.3g}" for d in diffs[:6])
    bad_total += len(runs) - ok
    print(f"| {name} | {len(runs)} | {ok} | {pre} | {post} | {len(refs)} distinct | "
          f"{eager} differ, {eager_var} vary | {dtxt} |")
print(f"RESULT: {'PASS' if bad_total == 0 else 'FAIL'} - {sum(len(r) for r in lanes.values())} runs "
      f"in {len(lanes)} lanes, {bad_total} not bit-exact or failed ({sys.argv[2]} s)")
PYEOF
