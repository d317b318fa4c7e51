#!/usr/bin/env bash
# check_completion.sh - gmbctl's bash completion (deploy/gmbctl.bash-completion)
# sourced into bash and called as readline would call it (COMP_WORDS,
# COMP_CWORD), against a live gmbd with a client named x holding tag t:
# commands from gmbctl --help, options, client names, that client's tags,
# device indexes, the socket from -s or $GMB_SOCKET, and nothing (quietly)
# without a daemon. Then a new interactive shell: bash-completion loads the
# completion make install (DESTDIR) put in place by itself.
# Run by `make check-completion` (no root needed).
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

expect "gmbctl " "help object objects pause priority resume status switch top trim watch"
expect "gmbctl -s $sock re" "resume"
expect "gmbctl -s $sock object " "drop grant pause resume revoke"
expect "gmbctl -s $sock object pause --d" "--discard"
expect "gmbctl -s $sock object resume --d" ""
expect "gmbctl -s $sock object dr" "drop"
expect "gmbctl -s $sock object drop --j" ""
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

# A new shell, as a user gets one (Debian's /etc/skel/.bashrc): bash-completion,
# which make deps installs, loads gmbctl's completion from where make install
# put it, at the first TAB, with nothing sourced by hand.
[ -r /usr/share/bash-completion/bash_completion ] ||
	fail "bash-completion is not installed, so a new shell completes nothing (make deps)"
stage=$T/stage
${MAKE:-make} --no-print-directory install DESTDIR="$stage" > "$T/install.log" 2>&1 ||
	{ cat "$T/install.log"; fail "make install DESTDIR=$stage"; }
mkdir -p "$T/home"
cp /etc/skel/.bashrc "$T/home/" 2>/dev/null ||
	printf '. /usr/share/bash-completion/bash_completion\n' > "$T/home/.bashrc"
# The -D loader, called as readline calls it at the first TAB after gmbctl.
got=$(env -i HOME="$T/home" TERM=dumb GMB_SOCKET="$sock" PATH="$stage/usr/local/bin:/usr/bin:/bin" \
	XDG_DATA_DIRS="$stage/usr/local/share:/usr/share" bash -i -c '
	COMP_WORDS=(gmbctl ""); COMP_CWORD=1; COMP_LINE="gmbctl "; COMP_POINT=7
	loader=$(complete -p -D 2>/dev/null | sed -n "s/.*-F \([^ ]*\) .*/\1/p")
	[ -n "$loader" ] || { echo "no default completion loader"; exit 1; }
	"$loader" gmbctl "" gmbctl
	complete -p gmbctl
	COMPREPLY=(); _gmbctl gmbctl "" gmbctl; printf "%s\n" "${COMPREPLY[@]}" | sort | paste -sd " "
' 2>/dev/null) || fail "a new shell: $got"
grep -q -- '-F _gmbctl gmbctl$' <<< "$got" || fail "a new shell did not load gmbctl's completion: $got"
grep -qx 'help object objects pause priority resume status switch top trim watch' <<< "$got" ||
	fail "a new shell's completion of 'gmbctl ': $got"

# End of input: the worker disconnects and exits.
pid=$WORKER_PID
eval "exec ${WORKER[1]}>&-"
wait "$pid" || fail "prog_worker exited with $?"
echo "$CHECK: PASS (commands, options, clients, tags, devices, sockets against a live gmbd; loaded by a new shell)"
