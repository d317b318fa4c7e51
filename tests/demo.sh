#!/usr/bin/env bash
# demo.sh - two workers take turns on one simulated 4 GiB device.
#
# gmbd runs on the host backend; "trainer" and "infer" each need 3 GiB, so
# only one fits at a time. Each round the operator pauses one and resumes
# the other with gmbctl; the workers check that their bytes and addresses
# survived. gmbctl status is printed between rounds.
set -euo pipefail
B=${GMB_BUILD_DIR:-build}
dir=$(mktemp -d /tmp/gmbdemo.XXXXXX)
export GMB_SOCKET=$dir/gmbd.sock
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

"$B/gmbd" --backend host --host-memory 4GiB --socket "$GMB_SOCKET" --log-level notice &
for _ in $(seq 100); do [ -S "$GMB_SOCKET" ] && break; sleep 0.05; done

# Each worker is a tests/prog_worker driven over a pipe: one command in,
# one "<rc> <text>" line out.
coproc TRAINER { exec "$B/tests/prog_worker"; }
coproc INFER { exec "$B/tests/prog_worker"; }
cmd() { # cmd WORKER COMMAND...
	local -n io=$1; shift
	echo "$*" >&"${io[1]}"
	local line; read -r line <&"${io[0]}"
	printf '  %-8s %-28s -> %s\n' "$who" "$*" "$line"
	[[ $line == 0* ]]
}
t() { who=trainer cmd TRAINER "$@"; }
i() { who=infer cmd INFER "$@"; }

say "trainer loads 3 GiB of weights (preserved across pauses)"
t connect trainer; t handler accept; t mode weights preserve
t malloc weights $((3 << 30)); t fill weights 0x11
say "infer cannot fit beside it: the broker says who holds the memory"
i connect infer; i handler accept; i mode kv zero
i malloc kv $((3 << 30)) || true
"$B/gmbctl" status

for round in 1 2 3; do
	say "round $round: operator pauses trainer, infer runs"
	"$B/gmbctl" pause trainer
	# kv is a "zero" tag: after a resume it reads zero, whatever it held.
	if [ "$round" = 1 ]; then i malloc kv $((3 << 30)); else "$B/gmbctl" resume infer; i check kv 0; fi
	i fill kv 0x22
	"$B/gmbctl" status
	say "round $round: operator pauses infer, trainer resumes at the same address"
	"$B/gmbctl" pause infer
	"$B/gmbctl" resume trainer
	t check weights 0x11; t addr weights
	"$B/gmbctl" status
done
say "done: every round kept trainer's bytes and addresses"
