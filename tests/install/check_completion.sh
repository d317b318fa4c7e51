#!/usr/bin/env bash
# check_completion.sh - gmbctl's bash completion (deploy/gmbctl.bash-completion)
# sourced into bash and called as readline would call it (COMP_WORDS,
# COMP_CWORD), against a live gmbd with a client named x holding tag t:
# commands from gmbctl --help, options, client names, that client's tags,
# device indexes, the socket from -s or $GMB_SOCKET, and nothing (quietly)
# without a daemon. Run by `make check-completion` (no root needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK=check-completion
. tests/install/lib.sh

sock=$T/gmbd.sock
gmbd_start build/gmbd "$sock" --host-devices 2
# The client: tests/prog_worker answers one line per command.
coproc WORKER { GMB_SOCKET=$sock exec build/tests/prog_worker; }
worker() {
	local reply
	echo "$*" >&"${WORKER[1]}"
	IFS= read -r reply <&"${WORKER[0]}" || fail "prog_worker died at '$*'"
	[[ $reply == "0 "* || $reply == 0 ]] || fail "prog_worker '$*': $reply"
}
worker connect x
worker malloc t 2097152
worker malloc u 2097152 1

PATH=$PWD/build:$PATH
# shellcheck source=/dev/null
. deploy/gmbctl.bash-completion
complete -p gmbctl | grep -- '-F _gmbctl' > /dev/null || fail "no completion registered for gmbctl"

# expect 'WORD...' 'WANT': complete the last WORD (the cursor at its end).
expect() {
	local want=$2 got
	read -r -a COMP_WORDS <<< "$1"
	[[ $1 == *" " ]] && COMP_WORDS+=("")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	COMP_LINE=$1
	COMP_POINT=${#COMP_LINE}
	COMPREPLY=()
	_gmbctl gmbctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}" 2> "$T/stderr"
	[ ! -s "$T/stderr" ] || fail "'$1': the completion wrote to stderr: $(cat "$T/stderr")"
	got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | paste -sd ' ')
	[ "$got" = "$want" ] || fail "'$1': got '$got', want '$want'"
}

expect "gmbctl " "help pause priority resume status switch top trim watch"
expect "gmbctl -s $sock re" "resume"
expect "gmbctl -s $sock pause " "x"
expect "gmbctl -s $sock pause x " "t u"
expect "gmbctl -s $sock resume x u" "u"
expect "gmbctl --socket $sock resume x t " ""
expect "gmbctl -s$sock trim " "0 1"
expect "gmbctl -s $sock status --j" "--json"
expect "gmbctl -s $sock pause x --j" ""
expect "gmbctl --h" "--help"
expect "gmbctl -s $T/gmbd.so" "$sock"
GMB_SOCKET=$sock expect "gmbctl pause " "x"
GMB_SOCKET=$sock expect "gmbctl pause x " "t u"
# By pid and by id too.
id=$(build/gmbctl -s "$sock" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clients"][0]["id"])')
expect "gmbctl -s $sock pause #$id " "t u"
expect "gmbctl -s $sock pause $WORKER_PID " "t u"
# No daemon there: nothing, and quietly.
expect "gmbctl -s $T/none pause " ""
expect "gmbctl -s $T/none pause x " ""

# End of input: the worker disconnects and exits.
pid=$WORKER_PID
eval "exec ${WORKER[1]}>&-"
wait "$pid" || fail "prog_worker exited with $?"
echo "$CHECK: PASS (commands, options, clients, tags, devices, sockets against a live gmbd)"
