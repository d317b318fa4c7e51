"""GPU test 2: a CUDA graph's own memory pauses with its tag.

A step of the transformer (large batch, so the graph's private pool of
static inputs, outputs and intermediates is big) is captured through
gmb.torch_memory_saver.cuda_graph(..., tag="cuda_graph") in preload mode.
pause("cuda_graph") and a trim of gmbd's pool must raise cuMemGetInfo's free
bytes by (nearly) the tag's size; after resume("cuda_graph") the graph
replays and its output equals the reference bit for bit. Weights stay in
ordinary memory: only the graph's pool moves.

Run with LD_PRELOAD=libgmb_preload.so (torch_run.sh does).

    torch_graph.py [--capture-mode global|thread_local|relaxed]

"global" is torch.cuda.graph's default and what torch_memory_saver users
get. During such a capture every thread of the process is barred from
"unsafe" driver calls unless it set its own capture mode to relaxed; libgmb
imports the chunks gmbd lends on its reader thread
(cuMemImportFromShareableHandle), so that thread must be relaxed too.
torch_run.sh also runs thread_local, which spares other threads, to tell
that case apart from any other failure.
"""

import argparse
import os
import time

# cuBLAS picks workspace-dependent algorithms per stream unless told not to;
# the graph replays on another stream than its warm-up, so without this two
# replays of the same graph could differ in the last bit with no pause at all.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import gmb
from gmb.torch_memory_saver import torch_memory_saver as saver
from torch_common import (GiB, bits_equal, capture, log, ms, my_tags, new_model, prompt_tokens,
                          result)

BATCH, PROMPT, MAX_SEQ = 64, 512, 1024


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture-mode", default="global", choices=("global", "thread_local", "relaxed"))
    cmode = ap.parse_args().capture_mode
    c = gmb.default_client()
    model = new_model().eval()
    kv_k, kv_v = model.kv_cache(BATCH, MAX_SEQ)
    prompt = prompt_tokens(BATCH, PROMPT)
    with torch.no_grad():
        g, out = capture(lambda: model.step(prompt, kv_k, kv_v),
                         lambda graph: saver.cuda_graph(graph, tag="cuda_graph",
                                                        capture_error_mode=cmode))
        g.replay()
        torch.cuda.synchronize()
        ref = out.clone()
    tags = my_tags(c)
    log(f"tags: {tags}")
    if "cuda_graph" not in tags:
        result(False, f"the graph's pool did not land in tag cuda_graph: {tags}")
    graph_bytes = tags["cuda_graph"]["bytes"]
    with torch.no_grad():
        g.replay()
        torch.cuda.synchronize()
    stable = bits_equal(out, ref)
    log(f"second replay before any pause bit-exact: {stable}")
    if not stable:
        result(False, f"capture mode {cmode}: two replays differ before any pause; the step "
               "is not deterministic, so bit-exactness after resume cannot be judged")
    c.trim()
    free0 = free_bytes()
    t0 = time.monotonic()
    saver.pause("cuda_graph")
    t1 = time.monotonic()
    # gmbd releases a chunk once this client has dropped its handle (it keeps
    # handles while paused): the reader thread answers at once, so poll briefly.
    released, pending = c.trim()
    for _ in range(60):
        free1 = free_bytes()
        if free1 - free0 >= 0.9 * graph_bytes:
            break
        time.sleep(0.05)
        more, pending = c.trim()
        released += more
    t2 = time.monotonic()
    saver.resume("cuda_graph")
    t3 = time.monotonic()
    with torch.no_grad():
        g.replay()
        torch.cuda.synchronize()
    same = bits_equal(out, ref)
    if not same:
        diff = (out.float() - ref.float()).abs()
        log(f"after resume: {(diff > 0).float().mean().item() * 100:.2f}% of {out.numel()} "
            f"outputs differ, max |diff| {diff.max().item():.4g}")
    gained = free1 - free0
    freed_ok = gained >= 0.9 * graph_bytes
    detail = (f"capture mode {cmode}: graph pool {graph_bytes / GiB:.2f} GiB in {tags['cuda_graph']['allocations']} "
              f"allocations; after pause + trim cuMemGetInfo free +{gained / GiB:.2f} GiB "
              f"(trim released {released / GiB:.2f} GiB, {pending} pending) "
              f"{'>=' if freed_ok else '<'} 90% of it; pause {ms(t0, t1):.1f} ms, resume "
              f"{ms(t2, t3):.1f} ms; replay after resume bit-exact: {'yes' if same else 'NO'}")
    result(same and freed_ok, detail)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        import traceback

        traceback.print_exc()
        result(False, f"{type(e).__name__}: {e} (gmb: {gmb.last_error()!r})")
