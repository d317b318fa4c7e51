#!/usr/bin/env bash
# boot.sh ROOT WORKER - boot ROOT (gmbd installed in it already) with
# systemd-nspawn; gmbd-scenario.service runs tests/systemd/scenario.sh and
# powers the container off. Exits 0 only when the scenario wrote PASS.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$1
worker=$2
result=$root/gmbd-scenario.result
scenario_log=$root/gmbd-scenario.log
log=build/nspawn-boot.log

rm -f "$result" "$scenario_log"
# Only this boot's journal: the tree is kept from one run to the next.
rm -rf "$root"/var/log/journal/*
install -D -m 0755 tests/systemd/scenario.sh "$root/usr/local/libexec/gmbd-scenario"
install -D -m 0755 "$worker" "$root/usr/local/libexec/gmbd-test-worker"
install -D -m 0644 tests/systemd/gmbd-scenario.service "$root/etc/systemd/system/gmbd-scenario.service"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf ../gmbd-scenario.service "$root/etc/systemd/system/multi-user.target.wants/gmbd-scenario.service"
# The scenario's settings: the host backend (no GPU in CI), small memory.
cat > "$root/etc/gmbd/gmbd.conf" <<'CONF'
# written by tests/systemd/boot.sh
backend = host
host-memory = 256MiB
max-chunk = 8MiB
rejoin-grace = 20
CONF
# The container's machine id must exist for journald; a fresh tree has none.
if [ ! -s "$root/etc/machine-id" ] && command -v systemd-machine-id-setup >/dev/null; then
	systemd-machine-id-setup --root="$root" >/dev/null
fi

echo "  NSPAWN  $root (systemd $(chroot "$root" systemctl --version | head -1 | cut -d' ' -f2))"
rc=0
timeout 600 systemd-nspawn --boot --register=no --keep-unit --console=pipe \
	-D "$root" > "$log" 2>&1 || rc=$?
verdict=$(cat "$result" 2>/dev/null || echo "no result (container rc=$rc)")
if [ "$verdict" != PASS ]; then
	echo "check-systemd: FAILED: $verdict" >&2
	echo "---- the scenario ($scenario_log) ----" >&2
	cat "$scenario_log" >&2 || true
	echo "---- the container's console ($log) ----" >&2
	tail -40 "$log" >&2
	exit 1
fi
grep '^scenario:' "$scenario_log" || true
echo "check-systemd: PASS (restart without loss under systemd $(chroot "$root" systemctl --version | head -1 | cut -d' ' -f2))"
