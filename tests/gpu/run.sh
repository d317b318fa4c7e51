#!/usr/bin/env bash
# run.sh - every GPU test scenario of issue 3, on the GPU machine, in one call.
#
#   tests/gpu/run.sh            build (tests/gpu/build.sh), then the scenarios
#   tests/gpu/run.sh --bench    the same, then bench/run.sh (the benchmark)
#   tests/gpu/run.sh --no-build use build-gpu/ as it is
#   tests/gpu/run.sh --only graph_survival,reclaim   some scenarios only
#   tests/gpu/run.sh --no-torch the PyTorch scenarios (tests/gpu/torch_run.sh)
#                               are run too unless this is given
#   SOAK_ROUNDS=20 tests/gpu/run.sh --only soak   a shorter soak (default 200 rounds)
#   GMB_TREE=<commit> tests/gpu/run.sh   the logs name that tree (a copy's git
#                               directory may be older than its files)
#
# Needs .gpu-deps/ and build/proto/ from tests/gpu/pack-deps.sh (carried
# from the build machine). Starts build-gpu/gmbd --backend cuda on a socket
# in a temp folder (and a second one with --budget 8GiB for the budget
# scenario), runs each scenario under `timeout`, reads its "RESULT:" line,
# stops gmbd, and prints the summary table last. Exit status 1 if any
# scenario failed, 0 otherwise (SKIP is not a failure).
#
# Logs go to $OUT (the device tool's folder) when set, else build-gpu/out:
# gpu-tests.log (everything: build, scenarios, gmbd's logs, nvidia-smi) and
# gpu-tests-table.txt (the summary table).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

B=${GPU_BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu-tests.log
TABLE=$OUTDIR/gpu-tests-table.txt
BUDGET_GIB=8
DO_BENCH=0 DO_BUILD=1 DO_TORCH=1 ONLY=""
ARGS="$*"

while [ $# -gt 0 ]; do
	case $1 in
	--bench) DO_BENCH=1 ;;
	--no-build) DO_BUILD=0 ;;
	--no-torch) DO_TORCH=0 ;;
	--only) ONLY=",$2,"; shift ;;
	-h | --help) sed -n '2,18p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

# shellcheck source=tests/gpu/lib.sh
. tests/gpu/lib.sh

TMPD=$(mktemp -d /tmp/gmb-gpu.XXXXXX)
# uid_isolation's second user must reach the socket: folder 0711, socket 0666.
chmod 0711 "$TMPD"
SOCK=$TMPD/gmbd.sock
DLOG=$TMPD/gmbd.log
SOCK2=$TMPD/gmbd-budget.sock
DLOG2=$TMPD/gmbd-budget.log
trap 'gmbd_stop_all; rm -rf "$TMPD"' EXIT

print_table() {
	local i pass=0 fail=0 skip=0 miss=0 overall
	for i in "${!NAMES[@]}"; do
		case ${RESULTS[$i]} in
		PASS) pass=$((pass + 1)) ;;
		SKIP) skip=$((skip + 1)) ;;
		MISS) miss=$((miss + 1)) ;; # the bench ran; some goals missed
		*) fail=$((fail + 1)) ;;
		esac
	done
	overall=PASS
	[ "$fail" -gt 0 ] && overall=FAIL
	write_table "==== gmbd GPU tests: $overall ($pass passed, $fail failed, $skip skipped$([ "$miss" -gt 0 ] && echo ", bench goals missed")) ====" \
		"command: tests/gpu/run.sh $ARGS"
	[ "$fail" = 0 ]
}

# scenario NAME TIMEOUT_S COMMAND... : runs it, reads its RESULT line.
scenario() {
	local name=$1 verdict detail t0 dead=""
	wanted "$name" || return 0
	t0=$SECONDS
	run_result "$@"
	verdict=$VERDICT detail=$DETAIL
	if [ -n "$SCN_GMBD_PID" ] && ! kill -0 "$SCN_GMBD_PID" 2>/dev/null; then
		dead=" [gmbd died during this scenario]"
		verdict=FAIL
		echo "==== gmbd (pid $SCN_GMBD_PID) died during $name" >>"$LOG"
		if [ "$SCN_GMBD_PID" = "$GMBD_PID" ]; then
			restart_gmbd
			SCN_GMBD_PID=$GMBD_PID
			dead=" [gmbd died during this scenario; restarted for the next]"
		fi
	fi
	record "$name" "$verdict" "$detail$dead ($((SECONDS - t0)) s)"
	if [ "$verdict" = FAIL ]; then
		echo "---- last lines of $name ----"
		tail -n 15 "$TMPD/$name.out"
		echo "----"
	fi
	return 0
}

restart_gmbd() {
	wait "$GMBD_PID" 2>/dev/null
	if gmbd_start "$SOCK" "$DLOG"; then
		GMBD_PID=$GMBD_STARTED_PID
	else
		GMBD_PID=""
	fi
	export GMBD_PID
}

: >"$LOG"
{
	echo "gmbd GPU tests: tests/gpu/run.sh $ARGS"
	machine_info
	nvidia-smi 2>&1
	echo "ulimit -n: $(ulimit -n); uid: $(id -u)"
} >>"$LOG"

if [ "$DO_BUILD" = 1 ]; then
	t0=$SECONDS
	echo "==== build: tests/gpu/build.sh" >>"$LOG"
	if timeout 600 tests/gpu/build.sh >>"$LOG" 2>&1; then
		record build PASS "gmbd, gmbctl, libgmb.a, tests and bench ($((SECONDS - t0)) s)"
	else
		record build FAIL "tests/gpu/build.sh failed; see gpu-tests.log"
		tail -n 30 "$LOG"
		print_table
		exit 1
	fi
fi

# The backend alone first: no broker involved.
if [ -x "$B/backend_smoke" ]; then
	if wanted backend_smoke; then
		t0=$SECONDS
		echo "==== backend_smoke: $B/backend_smoke" >>"$LOG"
		timeout -k 10 300 "$B/backend_smoke" >"$TMPD/smoke.out" 2>&1
		rc=$?
		cat "$TMPD/smoke.out" >>"$LOG"
		np=$(grep -ac '^PASS' "$TMPD/smoke.out")
		nf=$(grep -ac '^FAIL' "$TMPD/smoke.out")
		if [ "$rc" = 0 ]; then v=PASS; else v=FAIL; fi
		[ "$rc" = 124 ] && v=FAIL
		record backend_smoke "$v" "exit $rc: $np checks passed, $nf failed ($((SECONDS - t0)) s)"
		[ "$v" = FAIL ] && tail -n 10 "$TMPD/smoke.out"
	fi
elif [ -f tests/gpu/backend_smoke.c ]; then
	record backend_smoke FAIL "tests/gpu/backend_smoke.c did not build (see gpu-tests.log)"
else
	record backend_smoke SKIP "tests/gpu/backend_smoke.c not present"
fi

GMBD_PID="" SCN_GMBD_PID=""
if gmbd_start "$SOCK" "$DLOG"; then
	GMBD_PID=$GMBD_STARTED_PID
	SCN_GMBD_PID=$GMBD_PID # the gmbd a scenario uses: checked alive after it
	export GMB_SOCKET=$SOCK GMBD_PID
	record gmbd_start PASS "$B/gmbd --backend ${GMBD_BACKEND:-cuda} (pid $GMBD_PID) answered on its socket"
else
	record gmbd_start FAIL "gmbd did not start; see its log in gpu-tests.log"
	append_daemon_log "gmbd log" "$DLOG"
	print_table
	exit 1
fi

scenario daemon_memory 120 "$B/daemon_memory"
scenario graph_survival 420 "$B/graph_survival"
scenario reclaim 180 "$B/reclaim"
scenario many_allocs 420 "$B/many_allocs"
scenario uid_isolation 300 "$B/uid_isolation"
scenario two_gpus 180 "$B/two_gpus"
# Access for a peer GPU (gmb_malloc_peers); on one GPU its one-device part, then SKIP.
scenario peer_access 180 "$B/peer_access"
# A 1 GiB IPC open and close through libgmb next to the driver calls it is made of.
scenario ipc_probe 120 "$B/ipc_probe"

if wanted budget; then
	# The main gmbd's warm pool may hold most of device 0: give it back first.
	echo "==== gmbctl trim (main gmbd) before the --budget gmbd" >>"$LOG"
	GMB_SOCKET=$SOCK timeout 60 "$B/gmbctl" trim >>"$LOG" 2>&1
	if gmbd_start "$SOCK2" "$DLOG2" --budget "${BUDGET_GIB}GiB"; then
		BPID=$GMBD_STARTED_PID
		export GMB_SOCKET=$SOCK2 GMB_BUDGET_GIB=$BUDGET_GIB
		SCN_GMBD_PID=$BPID
		scenario budget 180 "$B/budget"
		SCN_GMBD_PID=$GMBD_PID
		export GMB_SOCKET=$SOCK
		gmbd_stop "$BPID" || echo "budget gmbd did not stop cleanly" >>"$LOG"
	else
		record budget FAIL "gmbd --budget ${BUDGET_GIB}GiB did not start"
	fi
fi

if wanted switch_bench; then
	# A gmbd whose pauses give memory back to the driver (--pool-keep 0):
	# the switch hands chunks over, pause + resume release and create.
	echo "==== gmbctl trim (main gmbd) before the --pool-keep 0 gmbd" >>"$LOG"
	GMB_SOCKET=$SOCK timeout 60 "$B/gmbctl" trim >>"$LOG" 2>&1
	SOCK3=$TMPD/gmbd-keep0.sock DLOG3=$TMPD/gmbd-keep0.log
	if gmbd_start "$SOCK3" "$DLOG3" --pool-keep 0; then
		KPID=$GMBD_STARTED_PID
		export GMB_SOCKET=$SOCK3
		SCN_GMBD_PID=$KPID
		scenario switch_bench 600 "$B/switch_bench"
		SCN_GMBD_PID=$GMBD_PID
		export GMB_SOCKET=$SOCK
		gmbd_stop "$KPID" || echo "--pool-keep 0 gmbd did not stop cleanly" >>"$LOG"
		append_daemon_log "gmbd --pool-keep 0 log" "$DLOG3"
	else
		record switch_bench FAIL "gmbd --pool-keep 0 did not start"
	fi
fi

if [ -n "$GMBD_PID" ]; then
	echo "==== gmbctl status at the end" >>"$LOG"
	timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1
	if gmbd_stop "$GMBD_PID"; then
		record gmbd_stop PASS "gmbd exited 0 on SIGTERM"
	else
		record gmbd_stop FAIL "gmbd did not exit cleanly on SIGTERM (see gpu-tests.log)"
	fi
fi
append_daemon_log "gmbd log" "$DLOG"
append_daemon_log "gmbd --budget log" "$DLOG2"

# The main gmbd is gone: what follows starts its own.
SCN_GMBD_PID=""

# Restart without loss on the cuda backend: a stand-in for systemd's fd store.
scenario restart 240 python3 tests/gpu/gpu_restart.py "$B" 8

# What one driver call costs over several mappings (informs the layout).
scenario unmap_probe 120 "$B/unmap_probe"
# A lend with and without another exported fd open (what the cuda backend keeps).
scenario export_probe 120 "$B/export_probe"
# What a chunk costs the process that maps it: made here, or imported (a lend).
scenario map_probe 120 "$B/map_probe"
# Whether a lend of fresh chunks gains from sending each fd as it is made.
scenario lend_probe 120 "$B/lend_probe"
# What a create costs right after a release, by which process released.
scenario scrub_probe 120 "$B/scrub_probe"
# Whether the last releases of a pause go faster split between two processes.
scenario release_probe 180 "$B/release_probe"
# Whether one chunk can back several allocations, mapped at offsets into it.
scenario slice_probe 240 "$B/slice_probe"
# What an allocation and a resume cost made here or lent, with gmbd's and
# libgmb's polling before blocking (--spin-us, $GMB_SPIN_US) and without,
# and made here with a holder taking a reference afterwards (a design
# gmbd does not have, measured to decide on it).
if wanted alloc_probe; then
	SOCKP=$TMPD/gmbd-probe.sock DLOGP=$TMPD/gmbd-probe.log
	SOCKN=$TMPD/gmbd-nospin.sock DLOGN=$TMPD/gmbd-nospin.log
	if gmbd_start "$SOCKP" "$DLOGP" && APID=$GMBD_STARTED_PID &&
		gmbd_start "$SOCKN" "$DLOGN" --spin-us 0; then
		NPID=$GMBD_STARTED_PID
		export GMB_SOCKET=$SOCKP GMB_SOCKET_NOSPIN=$SOCKN
		scenario alloc_probe 180 "$B/alloc_probe"
		export GMB_SOCKET=$SOCK
		unset GMB_SOCKET_NOSPIN
		gmbd_stop "$APID" || echo "alloc_probe's gmbd did not stop cleanly" >>"$LOG"
		gmbd_stop "$NPID" || echo "alloc_probe's --spin-us 0 gmbd did not stop cleanly" >>"$LOG"
	else
		record alloc_probe FAIL "alloc_probe's two gmbds did not start"
	fi
	append_daemon_log "alloc_probe gmbd log" "$DLOGP"
	append_daemon_log "alloc_probe --spin-us 0 gmbd log" "$DLOGN"
fi

# The PyTorch scenarios start their own gmbd; each of their rows joins this table.
if [ "$DO_TORCH" = 1 ] && [ -x tests/gpu/torch_run.sh ]; then
	echo "==== torch: tests/gpu/torch_run.sh (its log: torch-tests.log)" >>"$LOG"
	timeout -k 10 540 tests/gpu/torch_run.sh >"$TMPD/torch.out" 2>&1
	rc=$?
	# Every scenario row (torch_*, driver_ipc, ipc_bench), not the header or the build.
	rows=$(grep -a '^| [a-z]' "$OUTDIR/torch-tests-table.txt" 2>/dev/null |
		grep -av '^| scenario |\|^| build |')
	if [ -z "$rows" ]; then
		record torch FAIL "torch_run.sh exit $rc without a table: $(tail -n 1 "$TMPD/torch.out")"
	fi
	while IFS='|' read -r _ n v d _; do
		[ -n "$n" ] && record "$(echo $n)" "$(echo $v)" "$(echo "$d" | sed 's/^ *//; s/ *$//')"
	done <<<"$rows"
fi

# torch_memory_saver's own suite and an SGLang-like engine, each on a default gmbd.
if [ "$DO_TORCH" = 1 ]; then
	scenario tms_suite 960 tests/gpu/tms_suite.sh
	scenario sglang_flow 600 tests/gpu/tms_suite.sh --no-build --script tests/gpu/sglang_flow.py
	if [ "$DO_BENCH" = 1 ]; then
		scenario tms_bench 960 tests/gpu/tms_suite.sh --no-build --script tests/gpu/tms_bench.py \
			--json "$OUTDIR/tms-bench.json"
	fi
fi

# The soak: inference, trainer and a churning process under random pauses (its own gmbd).
# torch_run.sh built libgmb.so and the shim; SOAK_ROUNDS shortens it.
if [ "$DO_TORCH" = 1 ] && wanted soak; then
	SPY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
	if [ -f "$B/libgmb.so" ] && [ -f "$B/libgmb_preload.so" ] && [ -x "$SPY" ]; then
		SOAK_GMBD_LOG=$OUTDIR/soak-gmbd.log LD_LIBRARY_PATH=$PWD/.gpu-deps/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			PYTHONPATH=$PWD/client/python:$PWD/tests/gpu GMB_LIB=$PWD/$B/libgmb.so \
			GMB_PRELOAD_LIB=$PWD/$B/libgmb_preload.so \
			scenario soak 480 "$SPY" tests/gpu/soak.py --gmbd "$B/gmbd" --gmbctl "$B/gmbctl" \
			--rounds "${SOAK_ROUNDS:-200}"
	else
		record soak FAIL "needs $B/libgmb.so and $B/libgmb_preload.so (tests/gpu/torch_run.sh) and $SPY"
	fi
fi

# A tensor-parallel pair (NCCL all-reduce in its captured graph) switched out and
# back as one, a trainer pair in between (its own gmbd); SKIP on one GPU.
if wanted tp_pair; then
	SPY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
	if [ -f "$B/libgmb.so" ] && [ -f "$B/libgmb_preload.so" ] && [ -x "$SPY" ]; then
		TP_GMBD_LOG=$OUTDIR/tp-gmbd.log LD_LIBRARY_PATH=$PWD/.gpu-deps/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			PYTHONPATH=$PWD/client/python:$PWD/tests/gpu GMB_LIB=$PWD/$B/libgmb.so \
			GMB_PRELOAD_LIB=$PWD/$B/libgmb_preload.so \
			scenario tp_pair 600 "$SPY" tests/gpu/tp_pair.py --gmbd "$B/gmbd" --gmbctl "$B/gmbctl" \
			--rounds "${TP_ROUNDS:-10}"
	else
		record tp_pair FAIL "needs $B/libgmb.so and $B/libgmb_preload.so (tests/gpu/torch_run.sh) and $SPY"
	fi
fi

# What the preload shim adds to cudaMalloc/cudaFree outside regions (goal < 50 ns), and inside one.
if wanted preload_bench; then
	if [ -f "$B/libgmb.so" ] && [ -f "$B/libgmb_preload.so" ]; then
		LD_LIBRARY_PATH=$PWD/.gpu-deps/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			scenario preload_bench 300 bench/preload_bench.sh
	else
		record preload_bench FAIL "needs $B/libgmb.so and $B/libgmb_preload.so (tests/gpu/torch_run.sh)"
	fi
fi

if [ "$DO_BENCH" = 1 ]; then
	echo "==== bench: bench/run.sh (output in bench.log / bench-table.txt)" >>"$LOG"
	if GMB_GPU_SKIP_BUILD=1 timeout -k 10 560 bench/run.sh >"$TMPD/bench.out" 2>&1; then
		line=$(grep -a '^RESULT: ' "$TMPD/bench.out" | tail -n 1)
		v=${line#RESULT: }
		v=${v%% - *}
		[ "$v" = MISS ] || v=PASS
		record bench "$v" "${line#RESULT: * - }; tables in bench-table.txt"
	else
		record bench FAIL "bench/run.sh failed: $(tail -n 1 "$TMPD/bench.out")"
	fi
fi

print_table
