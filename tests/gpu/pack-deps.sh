#!/usr/bin/env bash
# pack-deps.sh - runs HERE (the build machine), not on the GPU machine.
#
# The GPU machine has gcc, make and nvcc but no libuv, no protobuf-c and no
# protoc-c (../shared/GPU-FACTS.md). This fills the ignored folder .gpu-deps/
# with their headers and static libraries, plus the systemd headers that
# daemon/system/sd.c includes (the GPU machine has libsystemd.so.0 but maybe not
# libsystemd-dev), and generates build/proto/gmb.pb-c.{c,h} with protoc-c.
# Carry `.gpu-deps` and `build/proto` to the GPU machine; tests/gpu/build.sh
# builds everything there from them without make's protoc-c rule.
set -euo pipefail
cd "$(dirname "$0")/../.."

D=.gpu-deps
INC=/usr/include
LIB=/usr/lib/x86_64-linux-gnu

need() {
	[ -e "$1" ] && return 0
	echo "pack-deps: missing $1 (install $2 here: make deps)" >&2
	exit 1
}
need "$INC/uv.h" libuv1-dev
need "$INC/uv" libuv1-dev
need "$INC/protobuf-c/protobuf-c.h" libprotobuf-c-dev
need "$INC/systemd/sd-daemon.h" libsystemd-dev
need "$LIB/libuv_a.a" libuv1-dev
need "$LIB/libprotobuf-c.a" libprotobuf-c-dev

rm -rf "$D"
mkdir -p "$D/include" "$D/lib"
cp -a "$INC/uv.h" "$INC/uv" "$D/include/"
cp -a "$INC/protobuf-c" "$D/include/"
# Only the sd-* headers sd-daemon.h needs (_sd-common.h and friends).
mkdir -p "$D/include/systemd"
cp -a "$INC"/systemd/*.h "$D/include/systemd/"
cp -a "$LIB/libuv_a.a" "$LIB/libprotobuf-c.a" "$D/lib/"

make --no-print-directory build/proto/gmb.pb-c.c build/proto/gmb.pb-c.h

echo "pack-deps: $(du -sh "$D" | cut -f1) in $D, generated build/proto/gmb.pb-c.{c,h}"
echo "pack-deps: carry these to the GPU machine: .gpu-deps build/proto"
