# lib.sh - shell helpers shared by tests/gpu/run.sh and bench/run.sh.
# Sourced, not run. Expects $B (the build folder) and $LOG (the combined log).
# shellcheck shell=bash

GMBD_PIDS=()

# gmbd_start SOCKET DAEMON_LOG [gmbd options...]
# Starts build-gpu/gmbd on the cuda backend, waits (at most 30 s) until its
# socket answers, makes the socket reachable for other uids (0666; the
# caller makes its folder 0711). Sets GMBD_STARTED_PID. Return: 0 or 1.
gmbd_start() {
	local sock=$1 dlog=$2 pid i
	shift 2
	rm -f "$sock"
	# GMBD_BACKEND=host only to dry-run these scripts on a machine without a GPU.
	echo "+ $B/gmbd --backend ${GMBD_BACKEND:-cuda} --socket $sock --log-level info $*" >>"$dlog"
	"$B/gmbd" --backend "${GMBD_BACKEND:-cuda}" --socket "$sock" --log-level info "$@" >>"$dlog" 2>&1 &
	pid=$!
	GMBD_PIDS+=("$pid")
	GMBD_STARTED_PID=$pid # read by the caller
	export GMBD_STARTED_PID
	for ((i = 0; i < 300; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "gmbd (pid $pid) exited during start; its log:" >>"$LOG"
			tail -n 30 "$dlog" >>"$LOG"
			return 1
		fi
		if [ -S "$sock" ] && GMB_SOCKET=$sock timeout 10 "$B/gmbctl" status >>"$LOG" 2>&1; then
			chmod 0666 "$sock"
			echo "gmbd pid $pid ready on $sock after $((i / 10)).$((i % 10)) s" >>"$LOG"
			return 0
		fi
		sleep 0.1
	done
	echo "gmbd (pid $pid) did not answer on $sock within 30 s" >>"$LOG"
	return 1
}

# gmbd_stop PID: SIGTERM, then SIGKILL after 15 s. Return: 0 when it exited
# by itself with status 0, else 1.
gmbd_stop() {
	local pid=$1 i rc
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 1; }
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < 150; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "gmbd pid $pid ignored SIGTERM for 15 s: SIGKILL" >>"$LOG"
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		return 1
	fi
	wait "$pid"
	rc=$?
	echo "gmbd pid $pid exited with $rc after SIGTERM" >>"$LOG"
	[ "$rc" = 0 ]
}

# Stops every gmbd this script started (for the EXIT trap).
gmbd_stop_all() {
	local pid
	for pid in "${GMBD_PIDS[@]}"; do
		kill -0 "$pid" 2>/dev/null && gmbd_stop "$pid"
	done
	return 0
}

# Appends a daemon log to $LOG, shortened to its head and tail when huge.
append_daemon_log() {
	local title=$1 dlog=$2 n
	[ -f "$dlog" ] || return 0
	n=$(wc -l <"$dlog")
	echo "==== $title ($n lines) ====" >>"$LOG"
	if [ "$n" -gt 6000 ]; then
		{
			head -n 2000 "$dlog"
			echo "... $((n - 4000)) lines left out ..."
			tail -n 2000 "$dlog"
		} >>"$LOG"
	else
		cat "$dlog" >>"$LOG"
	fi
}

# The machine, for the top of the log and the table.
machine_info() {
	echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	local rev
	if [ -n "${GMB_TREE:-}" ]; then
		# A copy of a working tree may carry a git directory older than
		# its files: the caller names the tree it copied.
		rev="$GMB_TREE (named by GMB_TREE)"
	elif rev=$(git rev-parse --short HEAD 2>/dev/null); then
		git diff --quiet HEAD 2>/dev/null || rev+=" + uncommitted changes"
	else
		rev="? (no git repository here)"
	fi
	echo "host: $(uname -n) $(uname -r); git: $rev"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 |
			sed 's/^/gpu: /'
	else
		echo "gpu: nvidia-smi not found"
	fi
}

# The summary table both run.sh and torch_run.sh print last. TAG prefixes
# the live lines; ONLY (",a,b,") picks scenarios.
NAMES=() RESULTS=() DETAILS=()
record() { # record NAME VERDICT DETAIL
	NAMES+=("$1") RESULTS+=("$2") DETAILS+=("$3")
	printf '[%s] %-20s %-4s %s\n' "${TAG:-gpu}" "$1" "$2" "$3"
}

wanted() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

# write_table HEADLINE...: the headline lines, the machine, then the rows, to
# $TABLE, the log and stdout.
write_table() {
	local i
	{
		echo
		printf '%s\n' "$@"
		machine_info
		echo
		echo "| scenario | result | detail |"
		echo "|---|---|---|"
		for i in "${!NAMES[@]}"; do
			echo "| ${NAMES[$i]} | ${RESULTS[$i]} | ${DETAILS[$i]//|//} |"
		done
	} >"$TABLE"
	cat "$TABLE" >>"$LOG"
	cat "$TABLE"
}

# run_result NAME LIMIT COMMAND...: runs it under timeout, its output in
# $TMPD/NAME.out and the log, and sets VERDICT and DETAIL from its last
# "RESULT: VERDICT - detail" line and its exit status (77: a skip).
run_result() {
	local name=$1 limit=$2 out=$TMPD/$1.out rc line
	shift 2
	echo "==== $name: $* (timeout ${limit}s, $(date -u +%T))" >>"$LOG"
	timeout -k 10 "$limit" "$@" >"$out" 2>&1
	rc=$?
	cat "$out" >>"$LOG"
	echo "==== $name: exit $rc" >>"$LOG"
	line=$(grep -a '^RESULT: ' "$out" | tail -n 1)
	VERDICT=${line#RESULT: }
	VERDICT=${VERDICT%% - *}
	DETAIL=${line#RESULT: * - }
	if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		VERDICT=FAIL DETAIL="timed out after ${limit} s; last line: $(tail -n 1 "$out")"
	elif [ -z "$line" ]; then
		VERDICT=FAIL DETAIL="exit $rc without a RESULT line; last line: $(tail -n 1 "$out")"
	elif [ "$VERDICT" = PASS ] && [ "$rc" != 0 ]; then
		VERDICT=FAIL DETAIL="said PASS but exited $rc: $DETAIL"
	elif [ "$VERDICT" = SKIP ] && [ "$rc" != 77 ] && [ "$rc" != 0 ]; then
		VERDICT=FAIL DETAIL="said SKIP but exited $rc: $DETAIL"
	fi
}
