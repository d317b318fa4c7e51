#!/usr/bin/env python3
"""pause_resume.py - the C example's worker in Python: allocate in two tags,
pause (memory back to gmbd), resume at the same addresses.

With gmbd running (make run, or gmbd --backend host on a socket of your own):
    GMB_SOCKET=run/gmbd.sock PYTHONPATH=client/python GMB_LIB=build/libgmb.so \\
        python3 examples/pause_resume.py
Installed (make install, or pip install ./client/python plus an installed
libgmb), neither PYTHONPATH nor GMB_LIB is needed. The sizes fit the host
backend's default device (8 GiB). Exit status 0 on success, 1 with the
reason on stderr otherwise.
"""

import sys

import gmb

MiB = 1 << 20


def tag_states(c):
    """{tag: state} of this client, from the node's status."""
    me = next(cl for cl in c.status()["clients"] if cl["id"] == c.id)
    return {t["name"]: t["state"] for t in me["tags"]}


def main():
    # A connection of its own ($GMB_SOCKET, else /run/gmbd/gmbd.sock).
    with gmb.Client(name="pause-resume-example", private=True) as c:
        with gmb.region("weights", "preserve"):   # bytes kept across a pause
            weights = c.malloc(256 * MiB)
        with gmb.region("kv"):                     # discard: a KV cache
            kv = c.malloc(1024 * MiB)
        # ... use the memory on device 0, capture CUDA graphs over it ...
        c.pause()                                  # every tag: memory back to gmbd
        print("paused:", tag_states(c))
        # ... another process uses the GPU ...
        c.resume()                                 # same addresses, weights' bytes back
        print("resumed:", tag_states(c), f"weights at {weights:#x}, kv at {kv:#x}")
        c.free(kv)
        c.free(weights)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except gmb.GmbError as e:   # gmbd's sentence: who holds the memory, for instance
        print(f"pause_resume.py: {e}", file=sys.stderr)
        sys.exit(1)
