#!/bin/bash
# scenario.sh - runs inside the nspawn container (systemd 252 as PID 1), as
# gmbd-scenario.service: gmbd installed by `make install`, started through
# gmbd.socket; a client allocates (host backend), `systemctl restart gmbd`
# and a crash (SIGKILL, Restart=on-failure) must leave its memory with its
# contents and addresses, `systemctl status` must show the STATUS= line and
# the watchdog must be armed and pinged. Then a drop-in lowers the unit's
# FileDescriptorStoreMax= below --fdstore-max: gmbd must warn, refuse what
# does not fit and still lose nothing at a restart. The verdict goes to
# /gmbd-scenario.result: PASS, or FAIL and why.
set -uo pipefail
RESULT=/gmbd-scenario.result
UNITS=/usr/local/lib/systemd/system
WORKER=/usr/local/libexec/gmbd-test-worker
SOCK=/run/gmbd/gmbd.sock

say() { echo "scenario: $*"; }
fail() {
	echo "FAIL: $*" > "$RESULT"
	say "FAIL: $*"
	systemctl status gmbd --no-pager 2>&1 | sed 's/^/scenario:   /'
	journalctl -b -u gmbd --no-pager -o short-monotonic 2>&1 | tail -40 | sed 's/^/scenario:   /'
	exit 1
}

# Bounded wait (no sleeping for readiness: each try asks systemd).
wait_for() {
	local what=$1; shift
	for _ in $(seq 200); do
		"$@" && return 0
		sleep 0.05
	done
	fail "timed out waiting for $what"
}

# The client: tests/prog_worker over a coproc, one command and answer a line.
ask() {
	echo "$*" >&"${W[1]}"
	IFS= read -r -t 60 ANS <&"${W[0]}" || fail "the client did not answer '$*'"
}
ok() {
	ask "$@"
	[ "${ANS%% *}" = 0 ] || fail "'$*' answered: $ANS"
	ANS=${ANS#* }
}

gmbd_status_line() { systemctl status gmbd --no-pager 2>/dev/null | grep -o 'Status: ".*"'; }
main_pid() { systemctl show -p MainPID --value gmbd; }

echo RUNNING > "$RESULT"
say "systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(uname -r)"

# ---- the installed units ----
systemd-sysusers || fail "systemd-sysusers"
getent group gmb > /dev/null || fail "no group gmb (sysusers.d)"
getent group gmb-admin > /dev/null || fail "no group gmb-admin (sysusers.d)"
getent passwd gmbd > /dev/null || fail "no user gmbd (sysusers.d)"
systemd-analyze verify "$UNITS/gmbd.socket" "$UNITS/gmbd.service" > /tmp/verify.log 2>&1 ||
	fail "systemd-analyze verify failed: $(head -3 /tmp/verify.log)"
grep -q . /tmp/verify.log && fail "systemd-analyze verify complained: $(head -3 /tmp/verify.log)"
say "units verify"

systemctl start gmbd.socket || fail "systemctl start gmbd.socket"
[ -S "$SOCK" ] || fail "no socket at $SOCK"
[ "$(stat -c %a:%G "$SOCK")" = 660:gmb ] || fail "socket is $(stat -c %a:%G "$SOCK"), not 660:gmb"
systemctl is-active -q gmbd && fail "gmbd started before anyone connected"
say "gmbd.socket listening, 0660 group gmb"

# ---- a client allocates; its first connection starts gmbd ----
coproc W { GMB_SOCKET=$SOCK exec "$WORKER"; }
# bash unsets W_PID as soon as the coproc exits: keep our own copy.
WORKER_PID=$W_PID
ok connect trainer
ok mode weights preserve
ok malloc weights 20971520
ADDR=$ANS
ok fill weights 0x5a
ok malloc kv 8388608
ok fill kv 0x11
systemctl is-active -q gmbd || fail "gmbd is not active after the first client"
PID1=$(main_pid)
ok status
BEFORE=$ANS
wait_for "STATUS= with the client" sh -c \
	'systemctl status gmbd --no-pager | grep -q "Status: \"1 client, 28.0 MiB lent"'
say "$(gmbd_status_line)"

# ---- the watchdog: armed, and pinged from the loop ----
[ "$(systemctl show -p WatchdogUSec --value gmbd)" = 10s ] || fail "WatchdogUSec is not 10s"
T1=$(systemctl show -p WatchdogTimestampMonotonic --value gmbd)
[ "$T1" -gt 0 ] || fail "no watchdog ping yet"
# Pings come every 5 s (half of WatchdogSec): the next one within 7 s.
for _ in $(seq 140); do
	T2=$(systemctl show -p WatchdogTimestampMonotonic --value gmbd)
	[ "$T2" -gt "$T1" ] && break
	sleep 0.05
done
[ "$T2" -gt "$T1" ] || fail "the watchdog timestamp did not move: $T1"
say "watchdog armed (10s) and pinged"

# ---- systemctl restart: nothing lost ----
systemctl restart gmbd || fail "systemctl restart gmbd"
PID2=$(main_pid)
[ "$PID2" != "$PID1" ] && [ "$PID2" != 0 ] || fail "gmbd was not restarted ($PID1 -> $PID2)"
ok status
AFTER=$ANS
[ "$AFTER" = "$BEFORE" ] || fail "status changed across the restart: $BEFORE -> $AFTER"
ok addr weights
[ "$ANS" = "$ADDR" ] || fail "weights moved from $ADDR to $ANS"
ok check weights 0x5a
ok check kv 0x11
ok pause weights
ok resume weights
ok check weights 0x5a
# A pause gives its chunks back and the resume makes new ones: the crash
# below must keep the document as it is now, counters included.
ok status
BEFORE=$ANS
journalctl -b -u gmbd --no-pager -p notice | grep -q "restored after a restart clients=1" ||
	fail "no 'restored after a restart' line at notice level in the journal"
journalctl -b -u gmbd --no-pager -p info | grep -q "client rejoined client=trainer" ||
	fail "no 'client rejoined' line in the journal"
journalctl -b -u gmbd --no-pager -p info |
	grep -q "fd store limit checked fdstore_max=16384 FileDescriptorStoreMax=16384 source=the unit's property" ||
	fail "gmbd did not read the unit's FileDescriptorStoreMax= over the bus"
wait_for "STATUS= after the restart" sh -c \
	'systemctl status gmbd --no-pager | grep -q "Status: \"1 client, 28.0 MiB lent"'
say "systemctl restart: pid $PID1 -> $PID2, contents, addresses and status kept"

# ---- a crash: Restart=on-failure, the fd store survives it too ----
systemctl kill -s KILL --kill-who=main gmbd || fail "systemctl kill"
wait_for "gmbd to come back" sh -c "[ \"\$(systemctl show -p MainPID --value gmbd)\" != $PID2 ] &&
	[ \"\$(systemctl show -p MainPID --value gmbd)\" != 0 ] && systemctl is-active -q gmbd"
PID3=$(main_pid)
ok status
AFTER=$ANS
[ "$AFTER" = "$BEFORE" ] || fail "status changed across the crash: $BEFORE -> $AFTER"
ok check weights 0x5a
ok addr weights
[ "$ANS" = "$ADDR" ] || fail "weights moved from $ADDR to $ANS"
say "SIGKILL: restarted by systemd (pid $PID2 -> $PID3), nothing lost"

# ---- the client leaves; a stop empties the store ----
echo quit >&"${W[1]}"
wait "$WORKER_PID" 2> /dev/null || true
wait_for "STATUS= without clients" sh -c \
	'systemctl status gmbd --no-pager | grep -q "Status: \"0 clients"'
systemctl stop gmbd.socket gmbd || fail "systemctl stop"
say "stopped"

# ---- FileDescriptorStoreMax= lower than --fdstore-max ----
# systemd 252 closes an fd stored past the unit's limit with a line in its
# own journal and nothing to gmbd: gmbd must learn the limit (the unit's
# property over the bus), warn with both numbers, and refuse what does not
# fit, so that a restart loses nothing a client was told it holds.
DROPIN=/run/systemd/system/gmbd.service.d
mkdir -p "$DROPIN"
printf '[Service]\nFileDescriptorStoreMax=4\n' > "$DROPIN/fdstore.conf"
systemctl daemon-reload || fail "daemon-reload with the drop-in"
[ "$(systemctl show -p FileDescriptorStoreMax --value gmbd)" = 4 ] ||
	fail "the drop-in did not set FileDescriptorStoreMax=4"
systemctl start gmbd.socket || fail "systemctl start gmbd.socket (small store)"
coproc W { GMB_SOCKET=$SOCK exec "$WORKER"; }
WORKER_PID=$W_PID
ok connect small
# The state and three 8 MiB chunks (max-chunk 8MiB) fill a store of 4.
ok malloc a 8388608
ok malloc b 8388608
ok malloc c 8388608
ok fill c 0x33
ask malloc d 8388608
case $ANS in
"-28 "*FileDescriptorStoreMax=4*) ;;
*) fail "a fourth chunk past FileDescriptorStoreMax=4 answered: $ANS" ;;
esac
PID4=$(main_pid)
journalctl -b _PID="$PID4" --no-pager -p warning |
	grep "FileDescriptorStoreMax= is lower than --fdstore-max" |
	grep -q "FileDescriptorStoreMax=4 fdstore_max=16384 source=the unit's property" ||
	fail "no warning with both numbers in the journal"
journalctl -b -u gmbd --no-pager | grep -q "Cannot store more fds than FileDescriptorStoreMax" &&
	fail "systemd closed a stored fd: $(journalctl -b -u gmbd --no-pager | grep 'Cannot store more')"
[ "$(systemctl show -p NFileDescriptorStore --value gmbd)" = 4 ] ||
	fail "the store holds $(systemctl show -p NFileDescriptorStore --value gmbd) fds, not 4"
ok status
BEFORE=$ANS
systemctl restart gmbd || fail "systemctl restart gmbd (small store)"
PID5=$(main_pid)
[ "$PID5" != "$PID4" ] || fail "gmbd was not restarted (small store)"
ok status
[ "$ANS" = "$BEFORE" ] || fail "status changed across the restart (small store): $BEFORE -> $ANS"
ok check c 0x33
journalctl -b _PID="$PID5" --no-pager -p notice |
	grep -q "restored after a restart clients=1 chunks=3 .*lost_chunks=0" ||
	fail "the restart with a small store did not restore 3 chunks and lose none"
say "FileDescriptorStoreMax=4 < --fdstore-max 16384: warned, the 4th chunk refused (ENOSPC), restart lost nothing"
echo quit >&"${W[1]}"
wait "$WORKER_PID" 2> /dev/null || true
systemctl stop gmbd.socket gmbd || fail "systemctl stop (small store)"
rm -rf "$DROPIN"
systemctl daemon-reload

journalctl -b -u gmbd --no-pager -o cat > /gmbd-journal.txt; say "$(grep -c . /gmbd-journal.txt) journal lines from gmbd"
echo PASS > "$RESULT"
say PASS
