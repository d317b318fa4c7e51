# lib.sh - shared by the packaging checks: a temporary folder, a real gmbd
# (host backend) on a socket in it, and failing with a reason.
# Sourced by bash scripts that run with set -euo pipefail.

T=$(mktemp -d "${TMPDIR:-/tmp}/gmbcheck.XXXXXX")
GMBD_PID=
GMBD_LOG=$T/gmbd.log

fail() {
	echo "$CHECK: FAILED: $*" >&2
	if [ -s "$GMBD_LOG" ]; then
		echo "---- gmbd's log ----" >&2
		tail -20 "$GMBD_LOG" >&2
	fi
	exit 1
}

lib_cleanup() {
	local rc=$?
	if [ -n "$GMBD_PID" ]; then
		kill "$GMBD_PID" 2>/dev/null || true
		wait "$GMBD_PID" 2>/dev/null || true
	fi
	rm -rf "$T"
	exit "$rc"
}
trap lib_cleanup EXIT

# gmbd_start GMBD SOCKET [ARGS...]: GMBD (--backend host) on SOCKET, as
# gmbd.socket starts it: systemd-socket-activate listens and execs gmbd at
# the first connection, so clients may connect as soon as it says it
# listens (read from its stderr: no polling). Sets GMBD_PID.
gmbd_start() {
	local gmbd=$1 sock=$2 line
	shift 2
	rm -f "$T/sa.fifo" && mkfifo "$T/sa.fifo"
	systemd-socket-activate --seqpacket -l "$sock" "$gmbd" --backend host "$@" \
		2>"$T/sa.fifo" &
	GMBD_PID=$!
	exec {sa_fd}<"$T/sa.fifo"
	while IFS= read -r -u "$sa_fd" line; do
		echo "$line" >> "$GMBD_LOG"
		case $line in *"Listening on"*) break ;; esac
	done
	case $line in *"Listening on"*) ;; *) fail "systemd-socket-activate did not listen on $sock" ;; esac
	# gmbd logs to the same pipe: drain it, never let it block.
	cat <&"$sa_fd" >> "$GMBD_LOG" &
	exec {sa_fd}<&-
}
