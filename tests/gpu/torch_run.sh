#!/usr/bin/env bash
# torch_run.sh - the PyTorch GPU tests of issue 5, on the GPU machine, in one call.
#
#   tests/gpu/torch_run.sh              build what is missing, then every scenario
#   tests/gpu/torch_run.sh --no-build   use build-gpu/ as it is
#   tests/gpu/torch_run.sh --only torch_graph,torch_rl_warm
#   tests/gpu/torch_run.sh --objects    the named-object rows alone (objects_*)
#
# The objects_* rows run only when asked for (--objects, or --only naming
# them): with them a whole run would pass the 540 s run.sh gives this script.
#
# Scenarios (each prints "RESULT: PASS|FAIL|MISS - detail" last; MISS: a goal
# missed, every check passed, not a failure):
#   torch_model_preload  a transformer's weights (preserve) and KV cache (discard)
#   torch_model_torch    pause, another process takes the GPU through gmbd and
#   torch_model_tms      pauses, resume: the CUDA graph replays bit for bit; through
#                        the preload shim, the pluggable allocator, gmb.torch_memory_saver
#   torch_graph          a graph's own pool (tag cuda_graph) freed on pause (cuMemGetInfo);
#   torch_graph_thread_local  the same captured in thread_local mode (a diagnostic:
#                        see torch_graph.py on capture modes)
#   torch_ipc_tag        CUDA tensors in gmbd memory through a torch.multiprocessing
#   torch_ipc_region     queue to a spawned child (cudaIpc* answered by the shim):
#                        bytes exact both ways, imports listed, a pause of the
#                        exported tag refused naming the importer, none left after;
#                        the sender's memory one tag (GMB_DEFAULT_TAG) or a region
#   driver_ipc           the driver's cuIpc* on gmbd memory through the global scope and
#                        the runtime's entry point lookup, a child reading every byte
#   torch_ipc_follow     (on the --pool-keep 0 gmbd below) the same sender's tag paused
#                        with GMB_IPC_FOLLOW=1 while the
#                        child holds a 1 GiB import under a captured graph: the pause
#                        completes (driver memory back), the import is mapped again at
#                        the same address on resume, the graph replays bit-exact
#   torch_ipc_sglang     RL weight updates through CUDA IPC (tests/gpu/torch_ipc_sync.py,
#                        a --pool-keep 0 gmbd): 20 rounds of 4 GiB in flattened buckets
#                        (ForkingPickler) to a spawned engine, both sides paused and
#                        resumed by gmbctl between rounds, checksums equal every round
#   torch_ipc_vllm       5 rounds of 2 GiB, one reduce_tensor per tensor keyed by GPU
#                        UUID, args[6] set to the engine's device
#   torch_ipc_kill       the exporter SIGKILLed while its child holds the tensors: the
#                        child reads them right, imports shown owner_freed, none after
#                        (all three: no import left, driver free memory back within 64 MiB)
#   ipc_bench            open + close of a 1 GiB handle and a 16 GiB weight sync on gmbd
#                        memory against the runtime's, same run (bench/ipc_bench.py)
#   ipc_bench_keep       the same with GMB_IPC_KEEP=1: closed imports kept for the next open
#   torch_ipc_sglang_keep  torch_ipc_sglang with GMB_IPC_KEEP=1: the trainer's pauses ask
#                        the engine's idle imports back
#   torch_rl_warm        trainer (AdamW, GMB_DEFAULT_TAG=train) and inference engine
#   torch_rl_cold        alternate 5 rounds driven through libgmb's Python API (a tool
#                        client's control requests); switch times next to the
#                        create-per-allocation baseline (warm: --pool-keep unlimited; cold: a
#                        second gmbd with --pool-keep 0, memory back to the driver)
#   torch_rl_switch      the same loop, each turn one switch (--switch) on a
#                        --pool-keep 0 gmbd: the trainer's chunks go straight to the engine
#   objects_readers      named objects (tests/gpu/torch_objects.py, a --pool-keep 0 gmbd
#                        of their own): a 16 GiB bf16 state dict published, four readers
#                        load it with load_state_dict(assign=True), outputs bit-exact with
#                        the trainer's; the open's median (MISS past 50 ms)
#   objects_versions     ten versions committed while two readers loop open latest /
#                        checksum / close: every checksum is its version's recorded one
#   objects_readonly     a kernel's write into a version ends in a CUDA error (in a child);
#                        another process reads the bytes unchanged
#   objects_pause        an 8 GiB object with two readers: `gmbctl object pause` frees
#                        it at the driver, resume brings the bytes back at the same
#                        data_ptr(), --discard brings zeros; the times
#   objects_restart      a 16 GiB object opened by an engine after its predecessor was
#                        SIGKILLed and after gmbd's own restart (fd store, as
#                        gpu_restart.py), start to first forward beside a file in the page
#                        cache (safetensors or torch.save) (MISS past 1 s open + forward)
#   objects_bench        a 16 GiB version's open + close, and a sum and an add over 4 GiB
#                        read-only vs the owner's vs plain memory (bench/object_bench.py)
#                        (all objects_*: no object, no import left, driver free memory
#                        back within 64 MiB)
#
# Needs, carried from the build machine: .gpu-deps (tests/gpu/pack-deps.sh, then
# tests/gpu/torch-deps.sh for libprotobuf-c.so.1) and build/proto. Builds
# gmbd/gmbctl with tests/gpu/build.sh if absent, and libgmb.so,
# libgmb_preload.so and torch_baseline itself. PyTorch: $TORCH_PYTHON, else
# /opt/torch/.venv/bin/python3, else python3 (the first with CUDA).
#
# Logs go to $OUT when set (the device tool's folder), else build-gpu/out:
# torch-tests.log (everything), torch-tests-table.txt (the summary),
# torch-rl-{warm,cold}.json, ipc-bench.json and object-bench.json. Exit 1 if a
# scenario failed. The last line is "RESULT: PASS|FAIL - n passed, m failed"
# (", k missed a goal" when some did), so run.sh can wrap this script.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

B=${GPU_BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$PWD/$B/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/torch-tests.log
TABLE=$OUTDIR/torch-tests-table.txt
D=.gpu-deps
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CC=${CC:-gcc}
DO_BUILD=1 ONLY=""
ARGS="$*"
OBJECT_ROWS=objects_readers,objects_versions,objects_readonly,objects_pause,objects_restart,objects_bench

while [ $# -gt 0 ]; do
	case $1 in
	--no-build) DO_BUILD=0 ;;
	--only) ONLY=",$2,"; shift ;;
	--objects) ONLY=",$OBJECT_ROWS," ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
	*) echo "torch_run.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

# shellcheck source=tests/gpu/lib.sh
. tests/gpu/lib.sh

TMPD=$(mktemp -d /tmp/gmb-torch.XXXXXX)
trap 'gmbd_stop_all; rm -rf "$TMPD"' EXIT
: >"$LOG"

TAG=torch

finish() {
	local i pass=0 fail=0 miss=0 overall=PASS missed=""
	for i in "${!NAMES[@]}"; do
		case ${RESULTS[$i]} in
		PASS) pass=$((pass + 1)) ;;
		MISS) miss=$((miss + 1)) ;; # it ran and every check held; a goal was missed
		*) fail=$((fail + 1)) ;;
		esac
	done
	[ "$fail" -gt 0 ] && overall=FAIL
	[ "$miss" -gt 0 ] && missed=", $miss missed a goal"
	write_table "==== gmbd PyTorch GPU tests: $overall ($pass passed, $fail failed$missed) ====" \
		"command: tests/gpu/torch_run.sh $ARGS; python: ${PY:-none} (torch ${TORCH_VERSION:-?})"
	echo "RESULT: $overall - $pass passed, $fail failed$missed (tests/gpu/torch_run.sh)"
	[ "$fail" = 0 ]
	exit $?
}

find_python() {
	local p
	for p in "${TORCH_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
		if [ -z "$p" ] || ! command -v "$p" >/dev/null 2>&1; then
			continue
		fi
		if "$p" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
			>>"$LOG" 2>&1; then
			PY=$p
			TORCH_VERSION=$("$p" -c 'import torch; print(torch.__version__)' 2>/dev/null)
			return 0
		fi
	done
	return 1
}

# The Makefile's source lists, without running any of its recipes.
mkvar() {
	make -s --no-print-directory -f Makefile -f - "torch-print-$1" 2>/dev/null <<'EOF'
torch-print-%:
	@echo $($*)
EOF
}

# libgmb.so (position-independent, protobuf-c shared), libgmb_preload.so, torch_baseline.
build_libs() {
	local src obj objs=() flags lib_src common_src preload_src stub
	lib_src=$(mkvar LIB_SRC)
	common_src=$(mkvar COMMON_SRC)
	preload_src=$(mkvar PRELOAD_SRC)
	if [ -z "$lib_src" ] || [ -z "$common_src" ] || [ -z "$preload_src" ]; then
		echo "cannot read LIB_SRC/COMMON_SRC/PRELOAD_SRC from the Makefile" >&2
		return 1
	fi
	if [ ! -e "$D/so/libprotobuf-c.so.1" ]; then
		echo "$D/so/libprotobuf-c.so.1 missing: run tests/gpu/torch-deps.sh here, carry $D" >&2
		return 1
	fi
	flags=(-std=gnu11 -O2 -g -fPIC -pthread -fvisibility=hidden -Wall -Wno-unused-parameter
		-D_GNU_SOURCE -I. -Ibuild -I"$D/include" -I"$CUDA_HOME/include")
	mkdir -p "$B/pic"
	for src in $lib_src $common_src build/proto/gmb.pb-c.c; do
		obj=$B/pic/${src//\//_}.o
		"$CC" "${flags[@]}" -c "$src" -o "$obj" || return 1
		objs+=("$obj")
	done
	# shellcheck disable=SC2016 # $ORIGIN is the dynamic linker's, not the shell's
	"$CC" -shared -pthread -Wl,-soname,libgmb.so.0 -Wl,--no-undefined -o "$B/libgmb.so" "${objs[@]}" \
		"$D/so/libprotobuf-c.so.1" -ldl -Wl,-rpath,'$ORIGIN/../.gpu-deps/so' || return 1
	# shellcheck disable=SC2086 # PRELOAD_SRC is a list of paths
	"$CC" "${flags[@]}" -shared -Wl,-soname,libgmb_preload.so -Wl,--no-undefined \
		-o "$B/libgmb_preload.so" $preload_src -ldl || return 1
	if readelf -d "$B/libgmb_preload.so" | grep NEEDED | grep -q 'cuda\|gmb\|protobuf'; then
		echo "libgmb_preload.so must not need CUDA, libgmb or protobuf-c:" >&2
		readelf -d "$B/libgmb_preload.so" | grep NEEDED >&2
		return 1
	fi
	stub=$CUDA_HOME/lib64/stubs
	[ -e "$stub/libcuda.so" ] || stub=$CUDA_HOME/targets/x86_64-linux/lib/stubs
	"$CC" -std=gnu11 -O2 -Wall -I"$CUDA_HOME/include" -o "$B/torch_baseline" \
		tests/gpu/torch_baseline.c -L"$stub" -lcuda
}

# scenario NAME TIMEOUT_S COMMAND...: runs it, reads its RESULT line.
scenario() {
	local name=$1 verdict detail t0
	wanted "$name" || return 0
	t0=$SECONDS
	run_result "$@"
	verdict=$VERDICT detail=$DETAIL
	record "$name" "$verdict" "$detail ($((SECONDS - t0)) s)"
	if [ "$verdict" != PASS ]; then
		echo "---- last lines of $name ----"
		tail -n 25 "$TMPD/$name.out"
		echo "----"
	fi
	# Whatever the scenario left in gmbd's pool goes back to the driver.
	GMB_SOCKET=$SOCK timeout 60 "$B/gmbctl" trim >>"$LOG" 2>&1
	return 0
}

{
	echo "gmbd PyTorch GPU tests: tests/gpu/torch_run.sh $ARGS"
	machine_info
	nvidia-smi 2>&1
} >>"$LOG"

if ! find_python; then
	record python FAIL "no python3 with a CUDA-enabled torch (set TORCH_PYTHON)"
	finish
fi
if [ "$DO_BUILD" = 1 ]; then
	t0=$SECONDS
	if [ ! -x "$B/gmbd" ] || [ ! -x "$B/gmbctl" ]; then
		echo "==== build: tests/gpu/build.sh" >>"$LOG"
		timeout 600 tests/gpu/build.sh >>"$LOG" 2>&1 || { record build FAIL "tests/gpu/build.sh failed"; finish; }
	fi
	echo "==== build: libgmb.so libgmb_preload.so torch_baseline" >>"$LOG"
	if build_libs >>"$LOG" 2>&1; then
		record build PASS "libgmb.so, libgmb_preload.so, torch_baseline ($((SECONDS - t0)) s)"
	else
		record build FAIL "building the shared libraries failed; see torch-tests.log"
		tail -n 20 "$LOG"
		finish
	fi
fi

export LD_LIBRARY_PATH=$PWD/$D/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/client/python:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
export GMB_LIB=$PWD/$B/libgmb.so GMB_PRELOAD_LIB=$PWD/$B/libgmb_preload.so
export PYTHONUNBUFFERED=1
SHIM=$GMB_PRELOAD_LIB
SOCK=$TMPD/gmbd.sock
# The warm pool: what torch_rl_warm measures (the default gives memory to the driver).
if ! gmbd_start "$SOCK" "$TMPD/gmbd.log" --pool-keep unlimited; then
	record gmbd FAIL "gmbd did not start; see torch-tests.log"
	append_daemon_log "gmbd log" "$TMPD/gmbd.log"
	finish
fi
GMBD_PID=$GMBD_STARTED_PID
export GMB_SOCKET=$SOCK

scenario torch_model_preload 180 env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_model.py --mode preload
scenario torch_model_torch 180 "$PY" tests/gpu/torch_model.py --mode torch
scenario torch_model_tms 180 env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_model.py --mode tms
scenario torch_graph 150 env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_graph.py
scenario torch_graph_thread_local 150 env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_graph.py \
	--capture-mode thread_local
scenario torch_ipc_tag 240 env LD_PRELOAD="$SHIM" GMB_DEFAULT_TAG=ipc GMB_DEFAULT_MODE=discard \
	GMB_CLIENT_NAME=ipc-sender "$PY" tests/gpu/torch_ipc.py --where tag
scenario torch_ipc_region 240 env LD_PRELOAD="$SHIM" GMB_CLIENT_NAME=ipc-sender "$PY" \
	tests/gpu/torch_ipc.py --where region
scenario driver_ipc 120 env LD_PRELOAD="$SHIM" GMB_DEFAULT_TAG=drv GMB_DEFAULT_MODE=discard \
	GMB_CLIENT_NAME=driver-ipc "$PY" tests/gpu/driver_ipc.py
scenario torch_rl_warm 300 env LD_PRELOAD="$SHIM" "$PY" tests/gpu/torch_rl.py --gmbctl "$B/gmbctl" \
	--rounds 5 --label warm --baseline "$B/torch_baseline" --json "$OUTDIR/torch-rl-warm.json"

if wanted torch_rl_switch; then
	# Each turn is one `gmbctl switch`, on a gmbd whose pauses give memory
	# back to the driver: the switch hands the trainer's chunks to the engine.
	SOCK3=$TMPD/gmbd-switch.sock
	if gmbd_start "$SOCK3" "$TMPD/gmbd-switch.log" --pool-keep 0; then
		SW_PID=$GMBD_STARTED_PID
		GMB_SOCKET=$SOCK3 scenario torch_rl_switch 300 env LD_PRELOAD="$SHIM" \
			GMB_SOCKET="$SOCK3" "$PY" tests/gpu/torch_rl.py --gmbctl "$B/gmbctl" --rounds 5 \
			--label cold --switch --json "$OUTDIR/torch-rl-switch.json"
		gmbd_stop "$SW_PID" || echo "the switch gmbd did not stop cleanly" >>"$LOG"
	else
		record torch_rl_switch FAIL "gmbd --pool-keep 0 did not start"
	fi
fi

if wanted torch_rl_cold; then
	SOCK2=$TMPD/gmbd-cold.sock
	if gmbd_start "$SOCK2" "$TMPD/gmbd-cold.log" --pool-keep 0; then
		COLD_PID=$GMBD_STARTED_PID
		GMB_SOCKET=$SOCK2 scenario torch_rl_cold 300 env LD_PRELOAD="$SHIM" GMB_SOCKET="$SOCK2" \
			"$PY" tests/gpu/torch_rl.py --gmbctl "$B/gmbctl" --rounds 5 --label cold \
			--baseline "$B/torch_baseline" --json "$OUTDIR/torch-rl-cold.json"
		gmbd_stop "$COLD_PID" || echo "the --pool-keep 0 gmbd did not stop cleanly" >>"$LOG"
	else
		record torch_rl_cold FAIL "gmbd --pool-keep 0 did not start"
	fi
fi

# CUDA IPC weight updates and the IPC bench, on a gmbd whose freed memory goes
# back to the driver (--pool-keep 0): the torch_ipc_* scenarios compare the
# driver's free memory before and after. Their first process stays outside
# gmbd (no shim) and starts the trainer under the shim itself.
if wanted torch_ipc_follow || wanted torch_ipc_sglang || wanted torch_ipc_sglang_keep ||
	wanted torch_ipc_vllm || wanted torch_ipc_kill || wanted ipc_bench || wanted ipc_bench_keep; then
	SOCK4=$TMPD/gmbd-ipc.sock
	if gmbd_start "$SOCK4" "$TMPD/gmbd-ipc.log" --pool-keep 0; then
		IPC_PID=$GMBD_STARTED_PID
		GMB_SOCKET=$SOCK4 scenario torch_ipc_follow 180 env LD_PRELOAD="$SHIM" GMB_SOCKET="$SOCK4" \
			GMB_DEFAULT_TAG=ipc GMB_DEFAULT_MODE=preserve GMB_IPC_FOLLOW=1 \
			GMB_CLIENT_NAME=ipc-sender "$PY" tests/gpu/torch_ipc_follow.py
		GMB_SOCKET=$SOCK4 scenario torch_ipc_sglang 180 env GMB_SOCKET="$SOCK4" "$PY" \
			tests/gpu/torch_ipc_sync.py --mode sglang --gmbctl "$B/gmbctl"
		GMB_SOCKET=$SOCK4 scenario torch_ipc_sglang_keep 180 env GMB_SOCKET="$SOCK4" GMB_IPC_KEEP=1 \
			"$PY" tests/gpu/torch_ipc_sync.py --mode sglang --gmbctl "$B/gmbctl"
		GMB_SOCKET=$SOCK4 scenario torch_ipc_vllm 180 env GMB_SOCKET="$SOCK4" "$PY" \
			tests/gpu/torch_ipc_sync.py --mode vllm --gmbctl "$B/gmbctl"
		GMB_SOCKET=$SOCK4 scenario torch_ipc_kill 180 env GMB_SOCKET="$SOCK4" "$PY" \
			tests/gpu/torch_ipc_sync.py --mode kill --gmbctl "$B/gmbctl"
		GMB_SOCKET=$SOCK4 scenario ipc_bench 240 env LD_PRELOAD="$SHIM" GMB_SOCKET="$SOCK4" \
			GMB_CLIENT_NAME=ipc-bench "$PY" bench/ipc_bench.py --json "$OUTDIR/ipc-bench.json"
		GMB_SOCKET=$SOCK4 scenario ipc_bench_keep 240 env LD_PRELOAD="$SHIM" GMB_SOCKET="$SOCK4" \
			GMB_IPC_KEEP=1 GMB_CLIENT_NAME=ipc-bench "$PY" bench/ipc_bench.py \
			--json "$OUTDIR/ipc-bench-keep.json"
		GMB_SOCKET=$SOCK4 timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1
		gmbd_stop "$IPC_PID" || echo "the IPC gmbd (--pool-keep 0) did not stop cleanly" >>"$LOG"
	else
		for n in torch_ipc_follow torch_ipc_sglang torch_ipc_sglang_keep torch_ipc_vllm \
			torch_ipc_kill ipc_bench ipc_bench_keep; do
			wanted "$n" && record "$n" FAIL "gmbd --pool-keep 0 did not start"
		done
	fi
fi

# Named objects (tests/gpu/torch_objects.py, bench/object_bench.py), on a
# gmbd of their own with --pool-keep 0: each case compares the driver's free
# memory before and after, from a first process outside gmbd. Only when
# asked for (--objects or --only): see the top. objects_restart starts and
# restarts a gmbd of its own besides (its fd store played as gpu_restart.py
# does).
objects_wanted() { [ -n "$ONLY" ] && wanted "$1"; }
any_objects=0
for n in ${OBJECT_ROWS//,/ }; do objects_wanted "$n" && any_objects=1; done
if [ "$any_objects" = 1 ]; then
	SOCK5=$TMPD/gmbd-objects.sock
	OBJ=(env GMB_SOCKET="$SOCK5" "$PY" tests/gpu/torch_objects.py --gmbctl "$B/gmbctl")
	if gmbd_start "$SOCK5" "$TMPD/gmbd-objects.log" --pool-keep 0; then
		OBJ_PID=$GMBD_STARTED_PID
		GMB_SOCKET=$SOCK5 scenario objects_readers 300 "${OBJ[@]}" --case readers
		GMB_SOCKET=$SOCK5 scenario objects_versions 240 "${OBJ[@]}" --case versions
		GMB_SOCKET=$SOCK5 scenario objects_readonly 180 "${OBJ[@]}" --case readonly
		GMB_SOCKET=$SOCK5 scenario objects_pause 240 "${OBJ[@]}" --case pause
		GMB_SOCKET=$SOCK5 scenario objects_restart 480 "${OBJ[@]}" --case restart --gmbd "$B/gmbd"
		GMB_SOCKET=$SOCK5 scenario objects_bench 240 env GMB_SOCKET="$SOCK5" \
			GMB_CLIENT_NAME=object-bench "$PY" bench/object_bench.py --gmbctl "$B/gmbctl" \
			--json "$OUTDIR/object-bench.json"
		GMB_SOCKET=$SOCK5 timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1
		gmbd_stop "$OBJ_PID" || echo "the objects gmbd (--pool-keep 0) did not stop cleanly" >>"$LOG"
	else
		for n in ${OBJECT_ROWS//,/ }; do
			objects_wanted "$n" && record "$n" FAIL "gmbd --pool-keep 0 did not start"
		done
	fi
fi

GMB_SOCKET=$SOCK timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1
gmbd_stop "$GMBD_PID" || echo "gmbd did not stop cleanly" >>"$LOG"
append_daemon_log "gmbd log" "$TMPD/gmbd.log"
append_daemon_log "gmbd --pool-keep 0 log" "$TMPD/gmbd-cold.log"
append_daemon_log "gmbd --pool-keep 0 (IPC) log" "$TMPD/gmbd-ipc.log"
append_daemon_log "gmbd --pool-keep 0 (objects) log" "$TMPD/gmbd-objects.log"
finish
