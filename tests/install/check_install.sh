#!/usr/bin/env bash
# check_install.sh - `make install DESTDIR=` as a packager runs it, for the
# default PREFIX and for /opt/gmb: every file of the install list in place
# and nothing else (no etc/passwd, group or shadow: users are made only on
# the live system), the units and gmb.pc rewritten for PREFIX, the Python
# module where the system's python3 looks, the man pages rendering without
# a warning; then the staged tree used: a C program built with pkg-config
# (shared and static) and the Python module, both against the staged gmbd;
# then uninstall, which keeps the configuration unless PURGE=1 (naming the
# staged copy) and leaves no empty folder behind. Install says which
# python3 it served, and when another python3 first on PATH will not find
# the module.
# Run by `make check-install` (no root needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK=check-install
. tests/install/lib.sh

MAKE=${MAKE:-make}
mk() { $MAKE --no-print-directory "$@"; }
VERSION=$(sed -n 's/^#define GMB_VERSION "\(.*\)"/\1/p' include/gmb.h)
PY=${PYTHON:-$(mk -s print-PYTHON)}
var() { mk -s "print-$1" PREFIX="$2"; }

# check_tree DESTDIR PREFIX: the staged files against the install list.
check_tree() {
	local d=$1 prefix=$2 f want got
	for f in $(var INSTALLED "$prefix"); do
		[ -e "$d$f" ] || [ -L "$d$f" ] || fail "$f: not installed (PREFIX=$prefix)"
	done
	want=$( (var INSTALLED "$prefix" | tr ' ' '\n'; echo /etc/gmbd/gmbd.conf) | grep . | sort)
	got=$(cd "$d" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort)
	[ "$want" = "$got" ] || fail "PREFIX=$prefix: staged files differ from the install list:
$(diff <(echo "$want") <(echo "$got") || true)"
	for f in passwd group shadow gshadow ld.so.cache; do
		[ ! -e "$d/etc/$f" ] || fail "install wrote /etc/$f into DESTDIR"
	done
	[ "$(readlink "$d$prefix/lib/libgmb.so")" = libgmb.so.0 ] || fail "libgmb.so is not a link to libgmb.so.0"
	[ "$(readelf -d "$d$prefix/lib/libgmb.so.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')" = libgmb.so.0 ] ||
		fail "libgmb.so.0's soname"
	# The units name this PREFIX's gmbd and documentation, nothing else.
	for f in gmbd.service gmbd.socket; do
		f=$d$prefix/lib/systemd/system/$f
		if [ "$prefix" != /usr/local ] && grep -n /usr/local "$f"; then fail "$f still names /usr/local"; fi
		grep -q "^Documentation=file:$prefix/share/doc/gmbd/README.md" "$f" || fail "$f: Documentation="
	done
	grep -qx "ExecStart=$prefix/sbin/gmbd" "$d$prefix/lib/systemd/system/gmbd.service" ||
		fail "gmbd.service: ExecStart= is not $prefix/sbin/gmbd"
	grep -qx "prefix=$prefix" "$d$prefix/lib/pkgconfig/gmb.pc" || fail "gmb.pc: prefix="
	grep -qx "libdir=$prefix/lib" "$d$prefix/lib/pkgconfig/gmb.pc" || fail "gmb.pc: libdir="
	# Each man page renders without a warning, and man finds it by name.
	for f in man1/gmbctl.1 man3/libgmb.3 man8/gmbd.8; do
		got=$(MANWIDTH=80 man --warnings -E UTF-8 -l "$d$prefix/share/man/$f" 2>&1 >/dev/null) ||
			fail "man -l $f failed: $got"
		[ -z "$got" ] || fail "man -l $f: $got"
		MANWIDTH=80 man -l "$d$prefix/share/man/$f" | grep '^NAME' > /dev/null || fail "man -l $f: no NAME section"
		f=${f##*/}
		[ "$(MANPATH=$d$prefix/share/man man -w "${f%.*}")" = "$d$prefix/share/man/man${f##*.}/$f" ] ||
			fail "man -w ${f%.*} does not find the staged page"
	done
}

# 0. What only the live system gets (a dry run: this machine is not changed):
# users from sysusers.d, the linker cache, systemd reloading its units.
live=$(mk -n install V=1) || fail "make -n install"
staged=$(mk -n install V=1 DESTDIR="$T/dry") || fail "make -n install DESTDIR="
for w in systemd-sysusers ldconfig 'systemctl daemon-reload'; do
	grep -q "$w" <<< "$live" || fail "make install would not run $w on the live system"
	if grep -q "$w" <<< "$staged"; then fail "make install DESTDIR= would run $w"; fi
done
live=$(mk -n uninstall V=1) && staged=$(mk -n uninstall V=1 DESTDIR="$T/dry") || fail "make -n uninstall"
grep -q ldconfig <<< "$live" || fail "make uninstall would not run ldconfig on the live system"
if grep -q 'ldconfig\|systemctl' <<< "$staged"; then fail "make uninstall DESTDIR= would run ldconfig or systemctl"; fi

# 1. The default PREFIX: the Python module lands where python3 looks.
d=$T/stage-local
mk install DESTDIR="$d" > "$T/install-local.log" 2>&1 || { cat "$T/install-local.log"; fail "make install"; }
check_tree "$d" /usr/local
pydir=$(var PYTHONDIR /usr/local)
"$PY" -c 'import sys; sys.exit(sys.argv[1] not in sys.path)' "$pydir" ||
	fail "PYTHONDIR $pydir is not on $PY's sys.path"
if grep -q 'set PYTHONPATH' "$T/install-local.log"; then fail "install warned about PYTHONPATH for /usr/local"; fi
grep -qF "install: Python module gmb for $PY (" "$T/install-local.log" ||
	fail "install did not say which interpreter it served: $(cat "$T/install-local.log")"
# Another python3 first on PATH (a pyenv, a venv) does not search there:
# install says so, and how to serve that one.
"$PY" -m venv --without-pip "$T/pyenv" || fail "$PY -m venv"
PATH=$T/pyenv/bin:$PATH mk install DESTDIR="$d" > "$T/install-path.log" 2>&1 ||
	{ cat "$T/install-path.log"; fail "make install with another python3 on PATH"; }
grep -qF "python3 on PATH is $T/pyenv/bin/python3" "$T/install-path.log" &&
	grep -qF "make install PYTHON=$T/pyenv/bin/python3" "$T/install-path.log" ||
	fail "install did not say that python3 on PATH does not find gmb: $(cat "$T/install-path.log")"
if [ "$PY" = /usr/bin/python3 ] && [ -f /etc/debian_version ]; then
	case $pydir in /usr/local/lib/python3.*/dist-packages) ;; *) fail "PYTHONDIR for /usr/local: $pydir" ;; esac
	[ "$(var PYTHONDIR /usr)" = /usr/lib/python3/dist-packages ] || fail "PYTHONDIR for /usr: $(var PYTHONDIR /usr)"
fi
# A second install keeps an edited configuration.
echo "# edited" >> "$d/etc/gmbd/gmbd.conf"
mk install DESTDIR="$d" > /dev/null 2>&1 || fail "make install (again)"
grep -qx '# edited' "$d/etc/gmbd/gmbd.conf" || fail "a second install replaced gmbd.conf"

# 2. PREFIX=/opt/gmb, which python3 does not search: said so at install.
p=/opt/gmb
d=$T/stage-opt
mk install DESTDIR="$d" PREFIX=$p > "$T/install-opt.log" 2>&1 || { cat "$T/install-opt.log"; fail "make install PREFIX=$p"; }
check_tree "$d" $p
pydir=$(var PYTHONDIR $p)
case $pydir in $p/lib/*) ;; *) fail "PYTHONDIR for $p: $pydir" ;; esac
grep -q "set PYTHONPATH=$pydir" "$T/install-opt.log" || fail "install did not say PYTHONPATH for $p"

# pkg-config against the staged tree (its sysroot).
export PKG_CONFIG_PATH=$d$p/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$d
[ "$(pkg-config --modversion gmb)" = "$VERSION" ] || fail "pkg-config --modversion gmb: $(pkg-config --modversion gmb)"
[ "$(pkg-config --cflags gmb | xargs)" = "-I$d$p/include" ] || fail "pkg-config --cflags gmb: $(pkg-config --cflags gmb)"
[ "$(pkg-config --libs gmb | xargs)" = "-L$d$p/lib -lgmb" ] || fail "pkg-config --libs gmb: $(pkg-config --libs gmb)"
[ "$(pkg-config --static --libs gmb | xargs)" = "-L$d$p/lib -lgmb -lprotobuf-c -ldl -lpthread" ] ||
	fail "pkg-config --static --libs gmb: $(pkg-config --static --libs gmb)"
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -o "$T/example" examples/pause_resume.c $(pkg-config --cflags --libs gmb) ||
	fail "cc with pkg-config --cflags --libs gmb"
# shellcheck disable=SC2046
$cc -o "$T/example-static" examples/pause_resume.c $(pkg-config --cflags gmb) \
	$(pkg-config --static --libs gmb | sed 's/-lgmb /-l:libgmb.a /') ||
	fail "cc with pkg-config --static --libs gmb"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
readelf -d "$T/example" | grep 'NEEDED.*\[libgmb\.so\.0\]' > /dev/null || fail "the program does not need libgmb.so.0"
if readelf -d "$T/example-static" | grep 'NEEDED.*libgmb' > /dev/null; then fail "the static program needs libgmb.so"; fi

# Both programs and the Python module against the staged gmbd.
sock=$T/gmbd.sock
gmbd_start "$d$p/sbin/gmbd" "$sock"
export GMB_SOCKET=$sock
lib=$d$p/lib
LD_LIBRARY_PATH=$lib ldd "$T/example" | grep "libgmb.so.0 => $lib/libgmb.so.0" > /dev/null ||
	fail "ldd: libgmb.so.0 is not the staged one"
LD_LIBRARY_PATH=$lib "$T/example" > "$T/example.out" 2>&1 || { cat "$T/example.out"; fail "the program failed"; }
grep -q '^resumed:' "$T/example.out" || fail "the program did not resume: $(cat "$T/example.out")"
"$T/example-static" > "$T/example-static.out" 2>&1 ||
	{ cat "$T/example-static.out"; fail "the static program failed"; }
# The module finds the staged libgmb as an installed one (libgmb.so.0 on
# the library path), then through GMB_LIB.
py_check() {
	(cd "$T" && env PYTHONPATH="$d$pydir" PYTHONDONTWRITEBYTECODE=1 "$@" "$PY" -c '
import sys, gmb
assert gmb.__file__.startswith(sys.argv[1]), gmb.__file__
assert gmb.library_path() == sys.argv[2], gmb.library_path()
with gmb.Client(name="staged", private=True) as c:
    assert c.status()["backend"] == "host"
' "$d$pydir/gmb/" "$lib/libgmb.so.0") || fail "the staged Python module ($*)"
}
py_check LD_LIBRARY_PATH="$lib"
py_check GMB_LIB="$lib/libgmb.so.0"
(cd "$T" && env PYTHONPATH="$d$pydir" LD_LIBRARY_PATH="$lib" PYTHONDONTWRITEBYTECODE=1 \
	"$PY" "$d$p/share/doc/gmbd/examples/pause_resume.py") > "$T/example-py.out" 2>&1 ||
	{ cat "$T/example-py.out"; fail "the staged Python example failed"; }

# 3. Uninstall: everything but the configuration, and every folder install
# made that is left empty; it names the staged configuration it kept. Then
# PURGE=1: the configuration too, and the staged tree is empty.
mk uninstall DESTDIR="$d" PREFIX=$p > "$T/uninstall.log" 2>&1 || { cat "$T/uninstall.log"; fail "make uninstall"; }
got=$(cd "$d" && find . \( -type f -o -type l \) | sed 's|^\.||')
[ "$got" = /etc/gmbd/gmbd.conf ] || fail "after uninstall: $got"
got=$(cd "$d" && find . -mindepth 1 -type d | sed 's|^\.||' | sort | paste -sd ' ')
[ "$got" = "/etc /etc/gmbd" ] || fail "uninstall left folders install made: $got"
grep -qF "kept $d/etc/gmbd/gmbd.conf (PURGE=1" "$T/uninstall.log" ||
	fail "uninstall DESTDIR= did not name the staged configuration it kept: $(cat "$T/uninstall.log")"
mk uninstall DESTDIR="$d" PREFIX=$p PURGE=1 > "$T/uninstall.log" 2>&1 || fail "make uninstall PURGE=1"
got=$(cd "$d" && find . -mindepth 1)
[ -z "$got" ] || fail "after uninstall PURGE=1: $got"
if grep -q kept "$T/uninstall.log"; then fail "uninstall PURGE=1 says it kept: $(cat "$T/uninstall.log")"; fi
# The live system's uninstall keeps what PREFIX and /etc have anyway.
keep=$(mk -s print-UNINSTALL_KEEP)
for f in /usr/local /usr/local/bin /usr/local/lib /usr/local/share /etc; do
	grep -qw -- "$f" <<< "$keep" || fail "make uninstall would remove $f once empty"
done
echo "$CHECK: PASS (DESTDIR for /usr/local and $p: files, units, gmb.pc, man, Python, programs, uninstall)"
