"""GPU: Model Runner V2's sampling parameters and sampler (K36 ``_temperature_kernel``, K37
``_min_p_kernel``, K38 ``_gumbel_sample_kernel``), ours (compiled Triton) beside vLLM's own compiled
kernels, at vLLM's launch (vocabulary 151,936; 64 and 256 rows of four requests' verification rows;
``apply_temperature``'s 8192-wide tiles, ``apply_min_p``'s and ``gumbel_sample``'s 1024; K38 as the
target's sampler launches it, its logits read only).

    SPECDIFF_VLLM=PATH python benchmarks/gpu_sample.py [--rows 64,256] [--out reports/gpu]

Each launch of K36 and K37 is timed from a fresh copy of the logits (both work in place; the copy is
timed alone and subtracted), K38's alone, with ``triton.testing.do_bench_cudagraph``. Ours must equal the oracle bit for
bit; vLLM's cells that differ are counted (C41's departures: its `/` and `tl.log` are approximate;
K38's scores by C29).
Exit status 1 on a wrong output of ours.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance import engine  # noqa: E402
from contracts import sample as contract  # noqa: E402
from reference import sample as oracle  # noqa: E402
from triton_impl import sample as ours  # noqa: E402

V = 151_936


def launch(kernel: Any, name: str, x: torch.Tensor, mapping: torch.Tensor, table: torch.Tensor) -> None:
    block = 8192 if name == contract.K36 else 1024
    grid = (x.shape[0], -(-V // block)) if name == contract.K36 else (x.shape[0],)
    kernel[grid](x, x.stride(0), mapping, table, V, BLOCK_SIZE=block)


def sampler_args(x: torch.Tensor, mapping: torch.Tensor, temp: torch.Tensor) -> dict[str, Any]:
    """K38 as the target's sampler launches it (gumbel_sample, sampler.py:350)."""
    n, nb = x.shape[0], -(-V // 1024)
    return dict(local_argmax_ptr=torch.empty(n, nb, dtype=torch.int64, device=x.device), local_argmax_stride=nb,
                local_max_ptr=torch.empty(n, nb, device=x.device), local_max_stride=nb, logits_cache_ptr=None, logits_cache_stride_0=0,
                logits_cache_stride_1=0, logits_cache_col_ptr=None, logits_cache_source_ptr=None, logits_cache_source_stride=0,
                logits_ptr=x, logits_stride=x.stride(0), expanded_idx_mapping_ptr=mapping,
                seeds_ptr=torch.arange(4, dtype=torch.int64, device=x.device) * 7919,
                pos_ptr=torch.arange(n, dtype=torch.int64, device=x.device), temp_ptr=temp, vocab_size=V, BLOCK_SIZE=1024,
                IS_DRAFTING=False, APPLY_TEMPERATURE=False, USE_FP64=False, PER_TOKEN_COL=False)


def measure_sampler(n: int, x: torch.Tensor, mapping: torch.Tensor, vllm_kernel: Any, bench: Any) -> dict[str, Any]:
    temp = torch.tensor([0.7, 1.0, 0.0, 2.0])
    want = sampler_args(x, mapping, temp)
    oracle._gumbel_sample_kernel(**want)
    result: dict[str, Any] = {"kernel": contract.K38, "rows": n, "copy_ms": 0.0}
    for who, kernel in (("ours", ours._gumbel_sample_kernel), ("vllm", vllm_kernel)):
        a = sampler_args(x.cuda(), mapping.cuda(), temp.cuda())
        grid = (n, -(-V // 1024))
        kernel[grid](**a)
        differ = int((a["local_argmax_ptr"].cpu() != want["local_argmax_ptr"]).sum())
        differ += int((a["local_max_ptr"].cpu() != want["local_max_ptr"]).sum())
        result[f"{who}_cells_differing"] = differ
        result[f"{who}_ms"] = bench(lambda k=kernel, a_=a, g=grid: k[g](**a_))
    result["ratio"] = result["vllm_ms"] / result["ours_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench_cudagraph

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--out", default="reports/gpu")
    ns = parser.parse_args(argv)
    engine.use(engine.named() or "0.33.0")
    loader = engine.loader()
    theirs = {n: loader.kernel(s.qualname) for n, s in ((contract.K36, contract.TEMPERATURE), (contract.K37, contract.MIN_P))}
    theirs[contract.K38] = loader.kernel(contract.GUMBEL_SAMPLE.qualname)
    rows_out, ok = [], True
    for n in (int(r) for r in ns.rows.split(",")):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, V, generator=g) * 4
        mapping = (torch.arange(n, dtype=torch.int32) // max(1, n // 4)).clamp(max=3)
        for name, table in ((contract.K36, torch.tensor([0.7, 1.3, 0.0, 2.0])), (contract.K37, torch.tensor([0.1, 0.0, 0.02, 0.5]))):
            want = x.clone()
            getattr(oracle, name)(want, want.stride(0), mapping, table, V, 8192 if name == contract.K36 else 1024)
            src, m, t = x.cuda(), mapping.cuda(), table.cuda()
            work = src.clone()
            copy_ms = do_bench_cudagraph(lambda w=work, s=src: w.copy_(s))
            result: dict[str, Any] = {"kernel": name, "rows": n, "copy_ms": copy_ms}
            for who, kernel in (("ours", getattr(ours, name)), ("vllm", theirs[name])):
                work.copy_(src)
                launch(kernel, name, work, m, t)
                got = work.cpu()
                differ = int((got != want).sum() - ((got != got) & (want != want)).sum())
                result[f"{who}_cells_differing"] = differ
                result[f"{who}_ms"] = do_bench_cudagraph(
                    lambda k=kernel, n_=name, w=work, s=src, m_=m, t_=t: (w.copy_(s), launch(k, n_, w, m_, t_))) - copy_ms
            ok = ok and result["ours_cells_differing"] == 0
            result["ratio"] = result["vllm_ms"] / result["ours_ms"]
            rows_out.append(result)
            print(json.dumps(result), flush=True)
        result = measure_sampler(n, x, mapping, theirs[contract.K38], do_bench_cudagraph)
        ok = ok and result["ours_cells_differing"] == 0
        rows_out.append(result)
        print(json.dumps(result), flush=True)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; vocabulary {V}; CUDA-graph ms, the copy subtracted", "",
             "| kernel | rows | ours | vLLM | vLLM / ours | cells of ours != oracle | cells of vLLM != oracle |", "|---|---|---|---|---|---|---|"]
    for r in rows_out:
        lines.append(f"| {r['kernel']} | {r['rows']} | {r['ours_ms']:.4f} | {r['vllm_ms']:.4f} | {r['ratio']:.2f} | "
                     f"{r['ours_cells_differing']} | {r['vllm_cells_differing']} |")
    print("\n".join(lines))
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-sample.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
