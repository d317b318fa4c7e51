"""The other process: takes (almost) all of gmbd's unlent budget on device 0,
writes it, then pauses and exits. Run by torch_common.run_hog() with
LD_PRELOAD=libgmb_preload.so and GMB_DEFAULT_TAG=hog (mode discard), so every
tensor it makes is gmbd's memory.

    torch_hog.py SLACK_BYTES      leave SLACK_BYTES of the budget unlent

Prints "HOG {json}" with the bytes it held, then exits 0 (1 on a wrong byte).
"""

import json
import sys
import time

import torch

import gmb

GiB = 1 << 30
MiB = 1 << 20


def main():
    slack = int(sys.argv[1]) if len(sys.argv) > 1 else GiB
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context first: it lives outside gmbd's budget
    c = gmb.default_client()
    dev = c.status()["devices"][0]
    target = dev["budget_bytes"] - dev["used_bytes"] - slack
    held, got = [], 0
    t0 = time.monotonic()
    for size in (GiB, 64 * MiB):
        while got + size <= target:
            try:
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError:
                break
            t.fill_(0xA5)
            held.append(t)
            got += size
    torch.cuda.synchronize()
    t1 = time.monotonic()
    ok = all(int(t[:: 1 << 20].min()) == 0xA5 and int(t[:: 1 << 20].max()) == 0xA5 for t in held)
    peak = c.status()["devices"][0]["used_bytes"]
    t2 = time.monotonic()
    c.pause()
    t3 = time.monotonic()
    print("HOG " + json.dumps({"bytes": got, "tensors": len(held), "device_used_at_peak": peak,
                               "budget": dev["budget_bytes"], "fill_s": t1 - t0,
                               "pause_ms": (t3 - t2) * 1e3, "bytes_ok": ok}), flush=True)
    sys.exit(0 if ok and got > 0 else 1)


if __name__ == "__main__":
    main()
