"""Where the time of ``sample_recovered_tokens_kernel`` at small batches goes, profiled: each layout's
kernel duration as the GPU records it (CUPTI, through ``torch.profiler``) beside the event-timed
``do_bench`` figure the GPU targets use, cold (L2 flushed before every launch, as
``do_bench`` does) and warm.

    SPECDIFF_VLLM=PATH python benchmarks/gpu_k4_profile.py [--out reports/gpu] [--sizes 1x8,8x4,64x4]

``do_bench`` brackets a launch with two CUDA events; at a few microseconds the events' own cost,
and the gap before the kernel starts, are part of what it reports. The profiler's kernel duration
is the kernel alone: the two together say how much of a small batch's time is the kernel's and how
much is fixed cost that no kernel layout can remove. The host's microseconds per launch (back to
back, before the device catches up) say whether a launch can hide behind ``do_bench``'s L2 flush. Outputs are checked against the oracle (ours)
and against ours (vLLM's) before anything is timed. The ratio is vLLM's time over ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_bench_engine import V  # noqa: E402
from test_bench_rejection import recovered_case  # noqa: E402

import contracts  # noqa: E402
from conformance.backends import BACKENDS, resolve_kernel  # noqa: E402
from conformance.runner import copy_args  # noqa: E402

K4 = "sample_recovered_tokens_kernel"
LAYOUTS = ("vllm", "triton", "triton-split")
FLUSH_BYTES = 256 << 20  # what triton.testing.do_bench zeroes between launches


def kernel_durations(launch: Any, rounds: int, cold: bool) -> list[float]:
    """Microseconds of every GPU kernel the launch ran, per round, as CUPTI records them (the L2
    flush's own kernel left out)."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    launch()  # compiled and cached before the profile starts
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            if cold:
                flush.zero_()
            with torch.profiler.record_function("launch"):
                launch()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "elementwise" not in e.name and "fill" not in e.name.lower() and e.name != "launch"]
    per_round = len(kernels) // rounds if rounds else 0
    if per_round == 0:
        return []
    return [sum(k.time_range.elapsed_us() for k in kernels[i * per_round:(i + 1) * per_round]) for i in range(rounds)]


def host_us(launch: Any, n: int = 300) -> float:
    """Host microseconds per launch: back-to-back launches, timed before the device catches up."""
    for _ in range(20):
        launch()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        launch()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / n


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/gpu")
    parser.add_argument("--sizes", default="1x8,8x4,64x4")
    parser.add_argument("--dtypes", default="f32,f64")
    parser.add_argument("--rounds", type=int, default=200)
    ns = parser.parse_args(argv)
    if not torch.cuda.is_available() or BACKENDS["vllm"].unavailable():
        print("benchmarks/gpu_k4_profile.py: skipped (needs CUDA and SPECDIFF_VLLM)")
        return 0
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = contracts.get(K4)
    rows: list[dict[str, Any]] = []
    wrong = False
    for dtype in ns.dtypes.split(","):
        for size in ns.sizes.split(","):
            b, n = (int(x) for x in size.split("x"))
            case = recovered_case(b, n, V, dtype)
            oracle_backend, oracle = resolve_kernel("reference", spec)
            expected = copy_args(case.args, "cpu")
            oracle_backend.launcher(oracle, case.grid)(**expected)
            want = expected["output_token_ids_ptr"]
            row: dict[str, Any] = {"requests": b, "drafts": n, "inv_q": dtype}
            for name in LAYOUTS:
                be, k = resolve_kernel(name, spec)
                a = copy_args(case.args, "cuda")
                launch = be.launcher(k, case.grid)

                def run(a: dict[str, Any] = a, launch: Any = launch) -> None:
                    launch(**a)

                run()
                torch.cuda.synchronize()
                differ = int((a["output_token_ids_ptr"].cpu() != want).sum())
                row[f"{name}_cells_differing"] = differ
                if differ and name != "vllm":
                    print(f"MISMATCH: {name} {b}x{n} {dtype} differs from the oracle in {differ} cells")
                    wrong = True
                cold = kernel_durations(run, ns.rounds, cold=True)
                warm = kernel_durations(run, ns.rounds, cold=False)
                row[f"{name}_kernel_cold_us"] = statistics.median(cold) if cold else None
                row[f"{name}_kernel_warm_us"] = statistics.median(warm) if warm else None
                row[f"{name}_do_bench_us"] = 1e3 * do_bench(run, warmup=25, rep=200, return_mode="median")
                row[f"{name}_host_us"] = host_us(run)
            for key in ("kernel_cold_us", "kernel_warm_us", "do_bench_us"):
                for name in ("triton", "triton-split"):
                    ours, theirs = row[f"{name}_{key}"], row[f"vllm_{key}"]
                    row[f"{name}_{key.removesuffix('_us')}_ratio"] = theirs / ours if ours and theirs else None
            rows.append(row)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    lines = ["| B x N | inv_q | layout | kernel, cold (us) | kernel, warm (us) | do_bench (us) | host per launch (us) "
             "| vLLM / ours: kernel cold | do_bench |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name in LAYOUTS:
            ratio = "" if name == "vllm" else (
                f"{r[f'{name}_kernel_cold_ratio'] or 0:.2f}x | {r[f'{name}_do_bench_ratio'] or 0:.2f}x")
            lines.append(f"| {r['requests']} x {r['drafts']} | {r['inv_q']} | {name} | {r[f'{name}_kernel_cold_us'] or 0:.2f} | "
                         f"{r[f'{name}_kernel_warm_us'] or 0:.2f} | {r[f'{name}_do_bench_us']:.2f} | {r[f'{name}_host_us']:.1f} | {ratio or ' | '} |")
    table = "\n".join(lines)
    print(f"\n{torch.cuda.get_device_name()}; torch {torch.__version__}\n{table}")
    (out / "k4-profile.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    (out / "k4-profile.md").write_text(table + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
