#!/usr/bin/env bash
# tms-deps.sh - runs HERE (the build machine): what tests/gpu/tms_suite.sh
# needs on the GPU machine that its PyTorch venv may lack, from Debian's
# archive: pytest and its pure-Python dependencies, unpacked (not installed)
# into .gpu-deps/py/. tms_suite.sh puts that folder on PYTHONPATH only when
# the venv has no pytest of its own. Carry .gpu-deps and .peer with the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."

D=$PWD/.gpu-deps/py
PKGS="python3-pytest python3-pluggy python3-iniconfig python3-packaging python3-py
python3-attr python3-more-itertools python3-exceptiongroup"
if [ ! -d .peer/torch_memory_saver/test ]; then
	echo "tms-deps: .peer/torch_memory_saver is missing (check out torch_memory_saver 4a43c97 there)" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download $PKGS >/dev/null)
rm -rf "$D"
mkdir -p "$D"
for deb in "$tmp"/*.deb; do
	dpkg-deb -x "$deb" "$tmp/x"
done
cp -r "$tmp/x/usr/lib/python3/dist-packages/." "$D/"
echo "tms-deps: $(ls "$D" | grep -c dist-info) packages in $D ($(du -sh "$D" | cut -f1))"
