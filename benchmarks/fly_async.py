"""The FLy pre-pass (K19, K20) and the async-scheduling update (K21), side by side with what vLLM 0.33.0
runs instead.

    SPECDIFF_VLLM=0.33.0 python benchmarks/fly_async.py [--requests 64,256,1024] [--out reports/bench]

* FLy: vLLM refuses FLy on a CPU, so there the port is measured against the oracle (PyTorch) only;
  on a GPU, our compiled kernels against vLLM's own compiled kernels. The batch has B requests of
  4 drafts each, window 2, 70 % of drafts the target's argmax (greedy) or accepted (random), the rest
  rejected with a high entropy: most positions examine their window. The vocabulary is 32,768; a
  position reads one cell of it, so it sets only the addressing.
* The async update: vLLM's own function (its eager body; vLLM wraps it in torch.compile), the port
  and the oracle, on B requests of which a quarter are new and the rest moved.

Both kernels rewrite an input in place, so every timed call starts from a fresh copy of it; the
copy's own time is reported and included in every column alike. After timing, every output is
compared with the oracle's: the port and our Triton kernels bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from topk_topp import median_ms, write_report  # noqa: E402

from conformance import engine  # noqa: E402
from conformance.backends import resolve_kernel  # noqa: E402

V = 32_768
N, W = 4, 2
K19, K20, K21 = "apply_fly_greedy_acceptance_kernel", "apply_fly_random_acceptance_kernel", "update_num_computed_tokens_for_batch_change"
INOUT = {K19: "target_argmax_ptr", K20: "uniform_probs_ptr", K21: "num_computed_tokens"}


def fly_args(kernel: str, b: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(b)
    t = b * N
    cu = (torch.arange(1, b + 1) * N).to(torch.int32)
    draft = torch.randint(0, V, (t,), generator=g, dtype=torch.int32)
    agree = torch.rand(t, generator=g) < 0.7
    entropy = torch.where(agree, 0.1, 2.0).to(torch.float32)
    if kernel == K19:
        argmax = torch.where(agree, draft.long(), (draft.long() + 1) % V)
        return dict(cu_num_draft_tokens_ptr=cu, draft_token_ids_ptr=draft, target_argmax_ptr=argmax,
                    target_logits_ptr=torch.randn(t, V, generator=g), fly_entropy_ptr=entropy, is_greedy_ptr=None,
                    vocab_size=V, fly_entropy_threshold=0.3, FLY_WINDOW_SIZE=W)
    probs = torch.rand(t, V, generator=g)
    u = torch.where(agree, 0.0, 0.999).to(torch.float64)
    return dict(cu_num_draft_tokens_ptr=cu, draft_token_ids_ptr=draft, draft_probs_ptr=None, target_probs_ptr=probs,
                uniform_probs_ptr=u, fly_entropy_ptr=entropy, is_greedy_ptr=torch.zeros(b, dtype=torch.bool), vocab_size=V,
                fly_entropy_threshold=0.3, NO_DRAFT_PROBS=True, FLY_WINDOW_SIZE=W)


def async_args(b: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(b)
    prev = torch.randperm(b, generator=g)
    prev[torch.rand(b, generator=g) < 0.25] = -1  # new requests
    return dict(num_computed_tokens=torch.randint(0, 4096, (b,), generator=g, dtype=torch.int32),
                num_accepted_tokens=torch.randint(1, N + 2, (b,), generator=g, dtype=torch.int32), prev_positions=prev,
                valid_sampled_token_count=torch.randint(1, N + 2, (b,), generator=g, dtype=torch.int32),
                prev_num_draft_tokens=torch.full((b,), N, dtype=torch.int32),
                cpu_num_computed_tokens=torch.randint(0, 4096, (b,), generator=g, dtype=torch.int32))


def measure(kernel: str, b: int, backends: list[str], reps: int) -> dict[str, Any]:
    import contracts
    from conformance.runner import bits, copy_args

    spec = contracts.get(kernel)
    host = fly_args(kernel, b) if kernel != K21 else async_args(b)
    name = INOUT[kernel]
    want = copy_args(host, "cpu")
    resolve_kernel("reference", spec)[1](**want)
    row: dict[str, Any] = {"kernel": kernel, "requests": b}
    for backend in backends:
        be, k = resolve_kernel(backend, spec)
        cuda = be.device() == "cuda"
        args = copy_args(host, be.device())
        fresh = args[name].clone()
        grid = tuple(spec.grid(host))
        run = be.launcher(k, grid)
        row[f"{backend}_copy_ms"] = median_ms(lambda args=args, fresh=fresh: args[name].copy_(fresh), cuda, reps)
        row[f"{backend}_ms"] = median_ms(lambda args=args, fresh=fresh, run=run: (args[name].copy_(fresh), run(**args)), cuda, reps)
        args[name].copy_(fresh)
        run(**args)
        same = bool(torch.equal(bits(args[name].cpu()), bits(want[name])))
        row[f"{backend}_equals_oracle"] = same
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", default="64,256,1024")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--out", default="reports/bench")
    ns = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    engine.use(engine.named() or "0.33.0")
    fly = ["cpu", "reference"] + (["triton", "vllm"] if cuda else [])
    rows = [measure(k, int(b), fly if k != K21 else ["cpu", "reference", "vllm"], ns.reps)
            for k in (K19, K20, K21) for b in ns.requests.split(",")]
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    cols = sorted({c.removesuffix("_ms") for r in rows for c in r if c.endswith("_ms") and not c.endswith("copy_ms")},
                  key=["cpu", "reference", "triton", "vllm"].index)
    lines = [f"{where}, torch {torch.__version__}; medians in ms, each call including a fresh copy of the rewritten input", "",
             "| kernel | requests | " + " | ".join(cols) + " | every output equals the oracle's |",
             "|---|---|" + "---|" * len(cols) + "---|"]
    for r in rows:
        cells = " | ".join(f"{r[c + '_ms']:.4f}" if c + "_ms" in r else "-" for c in cols)
        same = all(v for c, v in r.items() if c.endswith("_equals_oracle") and not c.startswith("vllm"))
        vllm = r.get("vllm_equals_oracle")
        lines.append(f"| `{r['kernel']}` | {r['requests']} | {cells} | {'yes' if same else 'NO'}"
                     + ("" if vllm is None else f" (vLLM: {'yes' if vllm else 'no'})") + " |")
    text = "\n".join(lines)
    print(text)
    write_report(Path(ns.out), "fly-async", text, {"device": where, "rows": rows})
    return 0 if all(v for r in rows for c, v in r.items() if c.endswith("_equals_oracle") and not c.startswith("vllm")) else 1


if __name__ == "__main__":
    sys.exit(main())
