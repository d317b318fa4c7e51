"""torch_ipc.py - CUDA tensors in gmbd memory sent to another process.

torch.multiprocessing pickles a CUDA tensor with reduce_tensor(): the
storage's segment base goes through cudaIpcGetMemHandle, its offset and size
travel beside the handle, and the receiving process opens the handle with
cudaIpcOpenMemHandle; the preload shim answers both for gmbd memory. This
sends, through a torch.multiprocessing queue to a spawned child:

  - a 256 MiB float32 tensor and a view into it at an offset,
  - three bf16 tensors carved out of one flattened bucket (the shape of
    SGLang's update_weights_from_tensor with a flattened bucket),

and checks, in one run:

  - the child sees every byte (each tensor equal to the CPU copy sent with it),
  - a write of the child's reaches the sender (the memory is shared, not copied),
  - gmbd's status lists the child's imports while it holds them, and a pause of
    the exported tag fails naming the importer, the tag staying active,
  - once the child has closed its handles and exited, no import is left and the
    sender's tensors are intact and still its own.

--where tag     the sender's whole memory is one tag (the caller sets
                GMB_DEFAULT_TAG=ipc, as a trainer under gmbd would run)
--where region  the tensors are made inside gmb.region("ipc", "preserve") with
                a MemPool (the stand-in region of torch_memory_saver users)

Run under LD_PRELOAD=libgmb_preload.so with GMB_SOCKET set (torch_run.sh does);
the child inherits both. Prints "RESULT: PASS|FAIL - detail" last.
"""

import argparse
import contextlib
import os
import time

import torch
import torch.multiprocessing as mp

import gmb
from torch_common import MiB, log, my_tags, result

TAG = "ipc"


def child_main(inbox, outbox):
    """Receives the tensors, checks them, writes a marker, holds them until told."""
    try:
        got = inbox.get(timeout=120)
        bad = [name for name, t, want in got if not torch.equal(t.cpu(), want)]
        big = next(t for name, t, _ in got if name == "big")
        big[0] = 12345.0
        torch.cuda.synchronize()
        outbox.put(("holding", os.getpid(), bad))
        inbox.get(timeout=120)  # "close"
        del got, big
        import gc

        gc.collect()
        torch.cuda.synchronize()
        outbox.put(("closed", os.getpid(), []))
    except Exception as e:  # the parent reports it
        outbox.put(("error", os.getpid(), [repr(e)]))


def make_tensors(where):
    """The tensors to send, made in gmbd memory either way (the MemPool keeps
    the region's segments apart from the runtime's)."""
    pool = torch.cuda.MemPool() if where == "region" else None
    with (torch.cuda.use_mem_pool(pool) if pool else contextlib.nullcontext()), \
         (gmb.region(TAG, "preserve") if pool else contextlib.nullcontext()):
        big = torch.randn(64 * MiB, device="cuda", dtype=torch.float32)
        sizes = [3 * MiB, 5 * MiB + 1234, 17 * MiB]
        bucket = torch.randn(sum(sizes), device="cuda", dtype=torch.bfloat16)
    views, off = [], 0
    for i, n in enumerate(sizes):
        views.append((f"w{i}", bucket[off:off + n]))
        off += n
    sent = [("big", big), ("view", big[1000:2_001_000])] + views
    return pool, big, bucket, sent


def imports_of(client, pid):
    return [m for m in client.status().get("imports", []) if m.get("importer_pid") == pid]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--where", choices=("tag", "region"), required=True)
    args = ap.parse_args()
    if not gmb.preload_active():
        result(False, "libgmb_preload.so is not in LD_PRELOAD")
    if args.where == "tag" and os.environ.get("GMB_DEFAULT_TAG") != TAG:
        result(False, f"--where tag needs GMB_DEFAULT_TAG={TAG}")
    client = gmb.default_client()
    pool, big, bucket, sent = make_tensors(args.where)
    torch.cuda.synchronize()
    lent = my_tags(client).get(TAG, {}).get("bytes", 0)
    if lent < big.numel() * 4 + bucket.numel() * 2:
        result(False, f"the tensors are not in gmbd memory (tag {TAG} holds {lent} bytes)")
    expect = [(name, t, t.cpu()) for name, t in sent]
    first = expect[0][2][0].item()
    want_big = expect[0][2].clone()
    want_big[0] = 12345.0
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=child_main, args=(inbox, outbox))
    os.environ["GMB_CLIENT_NAME"] = "ipc-child"  # the spawned child's environment
    t0 = time.monotonic()
    child.start()
    inbox.put(expect)
    what, pid, bad = outbox.get(timeout=180)
    sent_ms = (time.monotonic() - t0) * 1e3
    if what != "holding" or bad:
        child.kill()
        result(False, f"child {what}: {bad}")
    marker = big[0].item()
    held = imports_of(client, pid)
    pause_err = ""
    try:
        client.pause(TAG)
        client.resume(TAG)
        pause_err = "(the pause succeeded)"
    except Exception as e:  # gmb.Error: the pause was refused, the tag active
        pause_err = str(e)
    pause_ok = pause_err != "(the pause succeeded)" and str(pid) in pause_err
    intact_while = torch.equal(big.cpu(), want_big)
    inbox.put("close")
    what2, _, bad2 = outbox.get(timeout=120)
    child.join(60)
    deadline = time.monotonic() + 5
    left = imports_of(client, pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = imports_of(client, pid)
    big[0] = first
    again = all(torch.equal(t.cpu(), want) for name, t, want in expect)
    ok = (marker == 12345.0 and len(held) >= 1 and pause_ok and intact_while
          and what2 == "closed" and not bad2 and child.exitcode == 0 and not left and again)
    log(f"imports while held: {held}")
    log(f"pause while imported: {pause_err}")
    result(ok, f"--where {args.where}: {len(sent)} tensors ({big.numel() * 4 // MiB} MiB + "
               f"{bucket.numel() * 2 // MiB} MiB bucket) to a spawned child bit-exact: "
               f"{not bad}; its write seen: {marker == 12345.0}; imports listed while held: "
               f"{len(held)}; pause refused naming it: {pause_ok}; none left after close: "
               f"{not left}; sent and checked in {sent_ms:.0f} ms")


if __name__ == "__main__":
    main()
