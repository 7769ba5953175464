"""GPU benchmarks of Model Runner V2's eight kernels: our compiled Triton (``triton``) against vLLM's
own compiled kernels (``vllm``, with ``SPECDIFF_VLLM`` set) on the same CUDA inputs,
``triton.testing.do_bench`` medians in one run.

    SPECDIFF_VLLM=PATH python benchmarks/gpu_mrv2.py [--out reports/gpu] [--requests 64,256]

The inputs are the whole ``rejection_sample`` composition's, captured kernel by kernel on the C++
port (``benchmarks/test_bench_mrv2.py``'s batch: B requests x 4 drafts, vocabulary 151,936,
target and draft logits, block verification on so K14 and K15 run too). After timing, every
backend's outputs are compared with the port's: ours must agree bit for bit; vLLM's cells that
differ are counted (its C29 departures, docs/mrv2.md).
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

from harness import capture_launches  # noqa: E402
from test_bench_mrv2 import batch  # noqa: E402

import compositions.sampler as compositions  # noqa: E402
import contracts  # noqa: E402
from conformance.backends import BACKENDS, resolve_kernel  # noqa: E402
from conformance.runner import bits, copy_args  # noqa: E402

# K18 turns the accepted counts into emitted counts in place (num_sampled + 1): run again on its own
# output it writes a row further each time, past the end of `sampled`. Validated, not timed.
REPEATS_CHANGE_INPUTS = {"_insert_resampled_kernel"}


def main(argv: list[str] | None = None) -> int:
    import triton
    from triton.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/gpu")
    parser.add_argument("--requests", default="64,256")
    ns = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_mrv2.py: skipped, no CUDA GPU is present")
        return 0
    backends = [n for n in ("triton", "vllm") if n in BACKENDS and not BACKENDS[n].unavailable()]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, ok = [], True
    for b in (int(x) for x in ns.requests.split(",")):
        # The inputs on the C++ port (fast; conformance holds it to the oracle's bits).
        launches = capture_launches(lambda b=b: compositions.mrv2_rejection_sample(**batch(b), use_block_verification=True, backend="cpu"))
        for launch in launches:
            kernel, grid, before, want = launch.kernel, launch.grid, launch.before, launch.outputs
            spec = contracts.get(kernel)
            row: dict[str, Any] = {"kernel": kernel, "requests": b, "grid": list(grid)}
            for name in backends:
                print(f"{kernel} B={b} on {name}", flush=True)
                be, k = resolve_kernel(name, spec)
                args = copy_args(before, "cuda")
                run = be.launcher(k, grid)
                if kernel not in REPEATS_CHANGE_INPUTS:
                    row[f"{name}_ms"] = do_bench(lambda run=run, args=args: run(**args), warmup=25, rep=200, return_mode="median")
                args = copy_args(before, "cuda")  # re-validate on fresh inputs (in-place kernels)
                run(**args)
                torch.cuda.synchronize()
                differing = sum(int((bits(args[n].cpu()) != bits(w)).sum()) for n, w in want.items())
                row[f"{name}_cells_differing"] = differing
                if name == "triton" and differing:
                    print(f"MISMATCH: our {kernel} differs from the C++ port in {differing} cells at {b} requests")
                    ok = False
            if "vllm_ms" in row and "triton_ms" in row:
                row["ours_vs_vllm"] = round(row["vllm_ms"] / row["triton_ms"], 3)
            rows.append(row)
            print(json.dumps(row))
    name = torch.cuda.get_device_name()
    lines = [f"GPU: {name}, torch {torch.__version__}, triton {triton.__version__}; MRV2 kernels on the "
             "composition's inputs (B x 4 drafts, vocab 151936, block verification); medians of triton.testing.do_bench", "",
             "| kernel | B | ours ms | vLLM ms | vLLM / ours | cells of vLLM differing from the port |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['kernel']}` | {r['requests']} | {r.get('triton_ms', float('nan')):.4f} | {r.get('vllm_ms', float('nan')):.4f} | "
                     f"{r.get('ours_vs_vllm', float('nan')):.2f}x | {r.get('vllm_cells_differing', '-')} |")
    text = "\n".join(lines)
    print(text)
    (out / "gpu-mrv2.md").write_text(text + "\n")
    (out / "gpu-mrv2.json").write_text(json.dumps({"device": name, "rows": rows}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
