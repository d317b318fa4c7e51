"""Which kernel of torch_graph.py's step is not deterministic? (no gmbd)

Runs each operation of the captured step (TinyLM.step at batch 64, prompt
512: the Linear layers at both token counts, the head, LayerNorm, the two
attention calls, per SDPA backend) many times on fixed inputs, eagerly and
replayed from a CUDA graph, and counts the results that differ bit for bit
from the first. Prints one "PROBE {json}" line per operation and a RESULT
line naming the operations that varied.

    graph_probe.py [--reps 100]
"""

import argparse
import json
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_common import bits_equal, log, result  # noqa: E402

B, T, D, H, V, MAX = 64, 512, 1024, 16, 8192, 1024


def rnd(*shape, gen):
    return (torch.randn(*shape, generator=gen) * 0.5).to(device="cuda", dtype=torch.bfloat16)


def ops(gen):
    """name -> a closure computing one output from fixed inputs."""
    out = {}
    for tokens in (B * T, B):
        for din, dout in ((D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)):
            lin = torch.nn.Linear(din, dout).to(device="cuda", dtype=torch.bfloat16)
            x = rnd(tokens, din, gen=gen)
            out[f"linear_{tokens}x{din}->{dout}"] = (lambda lin=lin, x=x: lin(x))
    head = torch.nn.Linear(D, V, bias=False).to(device="cuda", dtype=torch.bfloat16)
    xh = rnd(B, D, gen=gen)
    out[f"head_{B}x{D}->{V}"] = lambda: head(xh)
    ln = torch.nn.LayerNorm(D).to(device="cuda", dtype=torch.bfloat16)
    xl = rnd(B * T, D, gen=gen)
    out["layernorm"] = lambda: ln(xl)
    q = rnd(B, H, T, D // H, gen=gen)
    k = rnd(B, H, T, D // H, gen=gen)
    v = rnd(B, H, T, D // H, gen=gen)
    kc = rnd(B, H, MAX, D // H, gen=gen)
    vc = rnd(B, H, MAX, D // H, gen=gen)
    q1 = rnd(B, H, 1, D // H, gen=gen)
    out["sdpa_prefill_causal"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out["sdpa_decode_513"] = lambda: F.scaled_dot_product_attention(
        q1, kc[:, :, :T + 1], vc[:, :, :T + 1], is_causal=False)
    # The whole step of torch_graph.py, in ordinary memory.
    from torch_common import new_model, prompt_tokens

    model = new_model().eval()
    kv_k, kv_v = model.kv_cache(B, MAX)
    prompt = prompt_tokens(B, T)
    out["step"] = lambda: model.step(prompt, kv_k, kv_v)
    return out


def backends():
    from torch.nn.attention import SDPBackend

    return {"default": None, "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def count_eager(fn, reps):
    ref = fn().clone()
    torch.cuda.synchronize()
    return ref, sum(0 if bits_equal(fn(), ref) else 1 for _ in range(reps))


def count_graph(fn, ref, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = fn()
    n, vs_eager = 0, 0
    g.replay()
    torch.cuda.synchronize()
    first = o.clone()
    vs_eager = 0 if bits_equal(first, ref) else 1
    for _ in range(reps):
        g.replay()
        torch.cuda.synchronize()
        n += 0 if bits_equal(o, first) else 1
    return n, vs_eager


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    reps = ap.parse_args().reps
    gen = torch.Generator().manual_seed(3)
    varied = []
    from torch.nn.attention import sdpa_kernel

    with torch.no_grad():
        for name, fn in ops(gen).items():
            multi = name.startswith("sdpa") or name == "step"
            for bname, be in (backends().items() if multi else [("-", None)]):
                rec = {"op": name, "sdpa": bname}
                try:
                    if be is None:
                        ref, ne = count_eager(fn, reps)
                        ng, ve = count_graph(fn, ref, reps)
                    else:
                        with sdpa_kernel(be):
                            ref, ne = count_eager(fn, reps)
                            ng, ve = count_graph(fn, ref, reps)
                    rec.update(eager_differ=ne, graph_differ=ng, graph_vs_eager=ve, reps=reps)
                    if ne or ng:
                        varied.append(f"{name}[{bname}] eager {ne}/{reps} graph {ng}/{reps}")
                except RuntimeError as e:
                    rec["error"] = str(e).splitlines()[0][:160]
                log("PROBE " + json.dumps(rec))
    result(not varied, "operations that varied: " + ("; ".join(varied) if varied else "none"))


if __name__ == "__main__":
    main()
