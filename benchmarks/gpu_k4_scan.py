"""How ``sample_recovered_tokens_kernel`` (engine layout) should scan a row, measured: every
(SCAN_BLOCK, SCAN_STAGES, num_warps) beside vLLM's own kernel, at the sizes its call site meets.
The heuristics in ``triton_impl/rejection.py`` are read off this table.

    SPECDIFF_VLLM=PATH python benchmarks/gpu_k4_scan.py [--out reports/gpu]

Each variant is our kernel's JIT function launched with the tuning constexprs set by hand (the
heuristics bypassed), validated against vLLM's tokens first (every variant must equal them: the
scan's step never changes a result, C15). Two medians per variant: ``do_bench`` (L2 flushed
before each launch: the probabilities come from DRAM) and ``do_bench_cudagraph`` (replayed with
no flush: a small batch's probabilities still in L2, as right after the softmax that made them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_bench_engine import V  # noqa: E402
from test_bench_rejection import recovered_case  # noqa: E402

import contracts  # noqa: E402
from conformance.backends import BACKENDS  # noqa: E402
from conformance.runner import copy_args  # noqa: E402
from triton_impl.rejection import sample_recovered_tokens_kernel  # noqa: E402

SIZES = [(1, 8), (8, 4), (64, 4), (128, 4), (256, 4), (1024, 4)]
BLOCKS, STAGES, WARPS = (2048, 4096, 8192), (1, 2, 3), (4, 8)


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench, do_bench_cudagraph

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/gpu")
    parser.add_argument("--dtypes", default="f32,f64")
    ns = parser.parse_args(argv)
    if not torch.cuda.is_available() or BACKENDS["vllm"].unavailable():
        print("benchmarks/gpu_k4_scan.py: skipped (needs CUDA and SPECDIFF_VLLM)")
        return 0
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = contracts.get("sample_recovered_tokens_kernel")
    vllm = BACKENDS["vllm"].resolve(spec)
    ours = sample_recovered_tokens_kernel.fn  # the JIT function under the heuristics
    rows = []
    for dtype in ns.dtypes.split(","):
        for b, n in SIZES:
            a = copy_args(recovered_case(b, n, V, dtype).args, "cuda")
            grid = (b, n)
            vllm[grid](**a)
            want = a["output_token_ids_ptr"].clone()
            row = {"requests": b, "drafts": n, "inv_q": dtype,
                   "vllm": [round(1e3 * do_bench(lambda a=a, grid=grid: vllm[grid](**a), return_mode="median"), 2),
                            round(1e3 * do_bench_cudagraph(lambda a=a, grid=grid: vllm[grid](**a), return_mode="median"), 2)]}
            for blk, st, w in itertools.product(BLOCKS, STAGES, WARPS):
                key = f"b{blk}-s{st}-w{w}"

                def run(blk=blk, st=st, w=w, a=a, grid=grid) -> None:
                    ours[grid](**a, SCAN_BLOCK=blk, SCAN_STAGES=st, num_warps=w)

                try:
                    a["output_token_ids_ptr"].fill_(-7)
                    run()
                    torch.cuda.synchronize()
                except Exception as e:  # out of shared memory at the widest stages
                    row[key] = f"{type(e).__name__}"
                    continue
                if not torch.equal(a["output_token_ids_ptr"], want):
                    print(f"MISMATCH {key} at {b}x{n} {dtype}")
                    return 1
                row[key] = [round(1e3 * do_bench(run, return_mode="median"), 2), round(1e3 * do_bench_cudagraph(run, return_mode="median"), 2)]
            timed = {k: v for k, v in row.items() if k.startswith("b") and isinstance(v, list)}
            cold = min(timed, key=lambda k: timed[k][0])
            warm = min(timed, key=lambda k: timed[k][1])
            print(f"{b}x{n} {dtype}: vllm {row['vllm']}  best cold {cold} {timed[cold]}  best warm {warm} {timed[warm]}", flush=True)
            rows.append(row)
            del a
            torch.cuda.empty_cache()
    (out / "k4-scan.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
