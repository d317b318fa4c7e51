"""torch_ipc_follow.py - an importer that follows its owner's pause.

A sender whose whole memory is one PRESERVE tag (GMB_DEFAULT_TAG=ipc,
GMB_DEFAULT_MODE=preserve) with GMB_IPC_FOLLOW=1 sends a 1 GiB float32
tensor through a torch.multiprocessing queue to a spawned child. The child
captures a CUDA graph that reads the imported tensor (out = big * 2 into
memory of its own) and replays it once. Then, while the child holds the
import and waits:

  - the sender pauses its tag: the pause succeeds although the child maps
    the memory (gmbd asked the child to unmap it first), the driver's free
    memory grows by the tag's bytes, and gmbd lists the child's import as
    unmapped;
  - the sender resumes: the child's import is mapped again at the same
    address before the resume returns;
  - the child replays the graph captured before the pause: its output equals
    the sender's bytes times two, bit for bit (the graph's addresses held),
    and a write of the child's reaches the sender;
  - after the child closed and exited, no import is left.

Run under LD_PRELOAD=libgmb_preload.so with GMB_SOCKET set (torch_run.sh
does); the child inherits both. Prints "RESULT: PASS|FAIL - detail" last.
"""

import gc
import os
import time

import torch
import torch.multiprocessing as mp

import gmb
from torch_common import GiB, MiB, log, my_tags, result

TAG = "ipc"
N = GiB // 4  # float32 elements: 1 GiB


def child_main(inbox, outbox):
    """Receives the tensor, captures a graph over it, replays it on request."""
    try:
        big, want = inbox.get(timeout=120)
        out = torch.empty_like(big)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mul(big, 2, out=out)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.mul(big, 2, out=out)
        graph.replay()
        torch.cuda.synchronize()
        first_ok = torch.equal(out.cpu(), want * 2)
        outbox.put(("holding", os.getpid(), big.data_ptr(), first_ok))
        inbox.get(timeout=300)  # "replay": the sender paused and resumed meanwhile
        graph.replay()
        torch.cuda.synchronize()
        again_ok = torch.equal(out.cpu(), want * 2)
        big[7] = 4242.0
        torch.cuda.synchronize()
        outbox.put(("replayed", os.getpid(), big.data_ptr(), again_ok))
        inbox.get(timeout=120)  # "close"
        del big, out, graph
        gc.collect()
        torch.cuda.synchronize()
        outbox.put(("closed", os.getpid(), 0, True))
    except Exception as e:  # the parent reports it
        outbox.put(("error", os.getpid(), 0, repr(e)))


def imports_of(client, pid):
    return [m for m in client.status().get("imports", []) if m.get("importer_pid") == pid]


def main():
    if not gmb.preload_active():
        result(False, "libgmb_preload.so is not in LD_PRELOAD")
    if os.environ.get("GMB_DEFAULT_TAG") != TAG or os.environ.get("GMB_IPC_FOLLOW") != "1":
        result(False, f"needs GMB_DEFAULT_TAG={TAG} and GMB_IPC_FOLLOW=1")
    client = gmb.default_client()
    big = torch.randn(N, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    lent = my_tags(client).get(TAG, {}).get("bytes", 0)
    if lent < N * 4:
        result(False, f"the tensor is not in gmbd memory (tag {TAG} holds {lent} bytes)")
    want = big.cpu()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    os.environ["GMB_CLIENT_NAME"] = "ipc-follower"
    child = ctx.Process(target=child_main, args=(inbox, outbox))
    child.start()
    inbox.put((big, want))
    what, pid, addr0, first_ok = outbox.get(timeout=180)
    if what != "holding" or first_ok is not True:
        child.kill()
        result(False, f"child {what}: {first_ok}")
    free0, _ = torch.cuda.mem_get_info()
    t0 = time.monotonic()
    try:
        client.pause(TAG)
        pause_err = ""
    except Exception as e:  # gmb.Error
        pause_err = str(e)
    pause_ms = (time.monotonic() - t0) * 1e3
    free1, _ = torch.cuda.mem_get_info()
    held = imports_of(client, pid)
    unmapped = bool(held) and all(m.get("mapped") is False for m in held)
    t1 = time.monotonic()
    try:
        client.resume(TAG)
        resume_err = ""
    except Exception as e:
        resume_err = str(e)
    resume_ms = (time.monotonic() - t1) * 1e3
    remapped = all(m.get("mapped") is True for m in imports_of(client, pid))
    inbox.put("replay")
    what2, _, addr1, again_ok = outbox.get(timeout=180)
    seen = big[7].item()
    inbox.put("close")
    what3, _, _, _ = outbox.get(timeout=120)
    child.join(60)
    deadline = time.monotonic() + 5
    left = imports_of(client, pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = imports_of(client, pid)
    big[7] = want[7].item()
    intact = torch.equal(big.cpu(), want)
    freed = free1 - free0
    log(f"pause: {pause_err or 'ok'} in {pause_ms:.1f} ms, driver free +{freed // MiB} MiB; "
        f"imports while paused: {held}; resume: {resume_err or 'ok'} in {resume_ms:.1f} ms")
    ok = (not pause_err and freed >= N * 4 - 64 * MiB and unmapped and not resume_err
          and remapped and what2 == "replayed" and again_ok is True and addr1 == addr0
          and seen == 4242.0 and what3 == "closed" and child.exitcode == 0 and not left
          and intact)
    result(ok, f"a 1 GiB import followed its owner: pause ok: {not pause_err} "
               f"({pause_ms:.0f} ms, driver free +{freed // MiB} MiB, import unmapped: "
               f"{unmapped}); resume ok: {not resume_err} ({resume_ms:.0f} ms, mapped again: "
               f"{remapped}); the child's graph replayed bit-exact at the same address: "
               f"{again_ok is True and addr1 == addr0}; its write seen: {seen == 4242.0}; "
               f"none left after close: {not left}")


if __name__ == "__main__":
    main()
