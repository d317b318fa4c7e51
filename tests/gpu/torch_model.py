"""GPU test 1: a transformer pauses, lends its memory to another process,
resumes, and its CUDA graph replays bit for bit.

    torch_model.py --mode preload|torch|tms

A small transformer (bf16, seeded weights) is loaded inside a "weights"
region (preserve) with its KV cache in a "kv_cache" region (discard); one
step (prefill into the cache + one decode) is captured with torch.cuda.graph
and replayed for a reference. Then pause(); another process (torch_hog.py)
takes the memory gmbd has left, writes it and pauses; resume(); the KV cache
is overwritten with NaN (its bytes were discarded anyway), the same graph
replays, and its output must equal the reference bit for bit.

Modes: preload = LD_PRELOAD=libgmb_preload.so and gmb.region; torch =
CUDAPluggableAllocator(gmb_torch_malloc) pools, no preload; tms =
gmb.torch_memory_saver with LD_PRELOAD, as torch_memory_saver users write it.
"""

import argparse
import time

import torch

import gmb
from torch_common import (GiB, Hooks, bits_equal, capture, device0, log, ms, my_tags,
                          new_model, params_checksum, prompt_tokens, result, run_hog)

BATCH, PROMPT, MAX_SEQ = 16, 128, 4096


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("preload", "torch", "tms"), required=True)
    mode = ap.parse_args().mode
    hooks = Hooks(mode)
    c = hooks.client
    torch.backends.cuda.matmul.allow_tf32 = False

    with hooks.region("weights", "preserve"):
        model = new_model()
    with hooks.region("kv_cache", "discard"):
        kv_k, kv_v = model.kv_cache(BATCH, MAX_SEQ)
    prompt = prompt_tokens(BATCH, PROMPT)  # ordinary memory: graph inputs stay put
    model.eval()
    weights_sum = params_checksum(model.parameters())
    with torch.no_grad():
        g, out = capture(lambda: model.step(prompt, kv_k, kv_v), torch.cuda.graph)
        g.replay()
        torch.cuda.synchronize()
        ref = out.clone()
    tags = my_tags(c)
    log(f"[{mode}] tags before pause: {tags}")
    # Through the drop-in each allocation keeps its own mode (as torch_memory_saver's
    # do) and the tag's shown mode is the tag's own: the bytes check below judges it.
    if set(tags) != {"weights", "kv_cache"} or (mode != "tms" and
                                                tags["weights"]["mode"] != "preserve"):
        result(False, f"mode {mode}: unexpected tags {tags}")
    lent = sum(t["bytes"] for t in tags.values())
    # What the other process could hold without the paused memory: gmbd's
    # unlent budget, or the driver's free memory where that is less (a pause
    # gives memory back to the driver). Holding more proves it got the paused
    # bytes either way.
    d0 = device0(c)
    free_before = d0["budget_bytes"] - d0["used_bytes"]
    if d0.get("driver"):
        free_before = min(free_before, d0["driver"]["free_bytes"])

    t0 = time.monotonic()
    hooks.pause()
    t1 = time.monotonic()
    paused = my_tags(c)
    if any(t["state"] != "paused" for t in paused.values()):
        result(False, f"mode {mode}: not every tag paused: {paused}")
    hog = run_hog(f"hog-{mode}", slack=GiB // 4)  # below the 1.15 GiB paused
    log(f"[{mode}] hog: {hog}")
    t2 = time.monotonic()
    hooks.resume()
    t3 = time.monotonic()

    with torch.no_grad():
        kv_k.fill_(float("nan"))
        kv_v.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
    same_out = bits_equal(out, ref)
    same_weights = params_checksum(model.parameters()) == weights_sum
    used_model_memory = hog["bytes"] > free_before
    detail = (f"mode {mode}: weights+kv {lent / GiB:.2f} GiB in gmbd; pause {ms(t0, t1):.1f} ms, "
              f"resume {ms(t2, t3):.1f} ms; the other process held {hog['bytes'] / GiB:.1f} GiB "
              f"(> {free_before / GiB:.1f} GiB it could have before the pause: "
              f"{'yes' if used_model_memory else 'NO'}); weights intact: "
              f"{'yes' if same_weights else 'NO'}; graph output bit-exact: "
              f"{'yes' if same_out else 'NO'}")
    result(same_out and same_weights and used_model_memory and hog["bytes_ok"], detail)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - one RESULT line whatever happens
        import traceback

        traceback.print_exc()
        result(False, f"{type(e).__name__}: {e} (gmb: {gmb.last_error()!r})")
