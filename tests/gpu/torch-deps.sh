#!/usr/bin/env bash
# torch-deps.sh - runs HERE (the build machine), after tests/gpu/pack-deps.sh.
#
# The PyTorch GPU tests (tests/gpu/torch_run.sh) load libgmb.so into Python
# processes, so it must be a shared library there. libprotobuf-c.a is not
# built position-independent, and the GPU machine has no libprotobuf-c.so.1
# (../shared/GPU-FACTS.md), so the shared library travels: this copies the
# build machine's libprotobuf-c.so.1 into .gpu-deps/so/, where torch_run.sh
# links and finds it (rpath and LD_LIBRARY_PATH). glibc there is newer than
# here, so a library built here runs there.
#
# Then carry .gpu-deps and build/proto to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."

D=.gpu-deps
LIB=/usr/lib/x86_64-linux-gnu/libprotobuf-c.so.1

if [ ! -e "$D/include/protobuf-c/protobuf-c.h" ] || [ ! -f build/proto/gmb.pb-c.c ]; then
	tests/gpu/pack-deps.sh
fi
if [ ! -e "$LIB" ]; then
	echo "torch-deps: missing $LIB (install libprotobuf-c1 here: make deps)" >&2
	exit 1
fi
mkdir -p "$D/so"
cp -L "$LIB" "$D/so/libprotobuf-c.so.1"
echo "torch-deps: $D/so/libprotobuf-c.so.1 ($(du -h "$D/so/libprotobuf-c.so.1" | cut -f1))"
echo "torch-deps: carry these to the GPU machine: .gpu-deps build/proto"
