"""The top-k/top-p mask at vLLM's scale (vocabulary 151,936; 64 and 256 rows), side by side with what
vLLM 0.33.0 runs instead: on a CPU without Triton, its PyTorch path ``apply_top_k_top_p_pytorch``
(a full sort); on a GPU, its own ``_topk_topp_kernel`` (the monolithic kernel) and the same PyTorch
path. On a GPU, the split top-p pipeline too (``--split-rows``, p = 0.9 alone, which vLLM's CUDA
path sends to it for <= 64 rows): ours and vLLM's three kernels as ``_apply_topp_split`` launches
them, beside both monolithic kernels on the same rows.

    SPECDIFF_VLLM=0.33.0 python benchmarks/topk_topp.py [--rows 64,256] [--out reports/bench]

Every timed call starts from a fresh copy of the logits (the mask is in place): the copy's own time
is reported and included in every row alike. After timing, outputs are compared: our Triton
kernel with the C++ port bit for bit (both state C35); vLLM's kernel and its PyTorch path by the
rows whose kept set differs from C35's (legitimate: docs/topk_topp.md, "vLLM's two paths").

Then the standalone top-p overflow probe: rows of N(0, 2.5) logits with one confident token at 35,
at temperature 0.1 (logits x 10), p = 0.9, 128 rows (more than 64: vLLM's CUDA path sends them to
the monolithic kernel). vLLM's kernel shifts exp by avg + 10 std of its first 8192-wide tile; the
confident token lies further above that than float32's exp can reach.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance import engine  # noqa: E402
from contracts import topk_topp as contracts  # noqa: E402
from cpu_impl.topk_topp import _topk_topp_kernel as port  # noqa: E402

V = 151_936
MODES = {"top-k 50": (50, None), "top-p 0.9": (None, 0.9), "top-k 50 + top-p 0.9": (50, 0.9)}


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    """N(0, 2.5) logits with one confident token per row (a peaked distribution, as decoding sees)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V, generator=g) * 2.5
    x[torch.arange(rows), torch.randint(0, V, (rows,), generator=g)] = 20.0
    return x


def launch_args(x: torch.Tensor, k: int | None, p: float | None, programs: int) -> dict[str, Any]:
    """One k and p for every row, at vLLM's CUDA tiles (8192, 4096)."""
    b = x.shape[0]
    kt = None if k is None else torch.full((b,), k, dtype=torch.int32, device=x.device)
    pt = None if p is None else torch.full((b,), p, dtype=torch.float32, device=x.device)
    return contracts.launch_args(x, kt, pt, programs=programs, block=8192, trunc=4096)


def median_ms(fn: Any, cuda: bool, reps: int) -> float:
    """The median wall time of ``fn`` in ms: triton.testing.do_bench on a GPU, else ``reps`` timed calls after a warm-up."""
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=200, return_mode="median"))
    for _ in range(min(reps, 3)):
        fn()  # warm: thread pools, allocator
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def thread_runs(script: str, measure: Callable[[int, int], list[dict[str, Any]]], doc: str | None,
                argv: list[str] | None) -> tuple[argparse.Namespace, list[dict[str, Any]]] | None:
    """The CPU benchmarks' driver (``--rows``, ``--threads``, ``--reps``, ``--out``): each thread count
    runs ``script --child`` in a process of its own (``OMP_NUM_THREADS``: the port and torch read it
    at start), whose ``measure(rows, reps)`` results come back as JSON. Returns the options and every
    result; None in a child, which has printed its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        print(json.dumps([r for b in ns.rows.split(",") for r in measure(int(b), ns.reps)]))
        return None
    results: list[dict[str, Any]] = []
    for t in ns.threads.split(","):
        done = subprocess.run([sys.executable, script, "--child", "--rows", ns.rows, "--reps", str(ns.reps)],
                              env={**os.environ, "OMP_NUM_THREADS": t}, capture_output=True, text=True, check=True)
        results += json.loads(done.stdout.strip().splitlines()[-1])
    return ns, results


def write_report(out: Path, stem: str, table: str, data: dict[str, Any]) -> None:
    """``<stem>-{cpu,gpu}.md`` (the table) and ``.json`` (every measurement) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tag = "gpu" if torch.cuda.is_available() else "cpu"
    (out / f"{stem}-{tag}.md").write_text(table + "\n")
    (out / f"{stem}-{tag}.json").write_text(json.dumps(data, indent=2) + "\n")


def kept(x: torch.Tensor) -> torch.Tensor:
    return x != float("-inf")


def vllm_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's own pivot tables (its heuristic reads them; C35 does not), from its source."""
    mod = "vllm.v1.sample.ops.topk_topp_triton."
    return tuple(torch.tensor(engine.loader().kernel(mod + name), device=device)  # type: ignore[return-value]
                 for name in ("_PERCENTILE_TO_STD_TABLE", "_NORMAL_CDF_TO_SIGMA_TABLE"))


def measure(b: int, mode: str, k: int | None, p: float | None, cuda: bool, reps: int, pytorch_path: Any, vllm_kernel: Any) -> dict[str, Any]:
    """One row of the table: every implementation's median time on ``b`` rows, and how its output compares."""
    device = torch.device("cuda" if cuda else "cpu")
    src_host = logits(b)
    src = src_host.to(device)
    work = torch.empty_like(src)
    row: dict[str, Any] = {"rows": b, "mode": mode}
    kt = None if k is None else torch.full((b,), k, dtype=torch.int64, device=device)
    pt = None if p is None else torch.full((b,), p, dtype=torch.float32, device=device)
    row["copy_ms"] = median_ms(lambda: work.copy_(src), cuda, reps)
    # vLLM's PyTorch path: allow_cpu_sync as its CPU platform sets it (top-k alone then skips the sort).
    row["vllm_pytorch_ms"] = median_ms(lambda: pytorch_path(work.copy_(src), kt, pt, allow_cpu_sync=not cuda), cuda, reps)
    # The C++ port on the host (the conformance oracle holds it to C35 bit for bit).
    a_host = launch_args(src_host.clone(), k, p, 1)
    if not cuda:
        row["cpp_port_ms"] = median_ms(lambda: (a_host["LOGITS"].copy_(src_host), port[(1,)](**a_host)), False, reps)
    a_host["LOGITS"].copy_(src_host)
    port[(1,)](**a_host)
    port_out = a_host["LOGITS"]
    torch_out = pytorch_path(src.clone(), kt, pt, allow_cpu_sync=not cuda).cpu()
    row["vllm_pytorch_rows_differing"] = int((kept(torch_out) != kept(port_out)).any(1).sum())
    if cuda:
        from triton_impl.topk_topp import _topk_topp_kernel as ours

        programs = min(torch.cuda.get_device_properties(0).multi_processor_count, b)
        for name, kernel in (("triton", ours), ("vllm_triton", vllm_kernel)):
            a = launch_args(work, k, p, programs)
            if name == "vllm_triton":
                a["PERCENTILE_TO_STD_TABLE"], a["NORMAL_CDF_TO_SIGMA_TABLE"] = vllm_tables(device)
            run = kernel[(programs,)]
            row[f"{name}_ms"] = median_ms(lambda run=run, a=a: (work.copy_(src), run(**a, num_warps=8)), True, 0)
            work.copy_(src)
            run(**a, num_warps=8)
            torch.cuda.synchronize()
            out = work.cpu()
            if name == "triton":
                row["triton_equals_port"] = torch.equal(out.view(torch.int32), port_out.view(torch.int32))
            else:
                row["vllm_triton_rows_differing"] = int((kept(out) != kept(port_out)).any(1).sum())
    print(json.dumps(row), flush=True)
    return row


def split_pipeline(kernels: dict[str, Any], x: torch.Tensor, p: torch.Tensor, num_sm: int,
                   workspace: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``_apply_topp_split``'s launches (``contracts.split_launches``) of ``kernels`` over ``x``, 8 warps."""
    s = contracts.split_count(*x.shape, num_sm)
    for name, grid, args in contracts.split_launches(x, None, p, slices=s, workspace=workspace):
        kernels[name][grid](**args, num_warps=8)


def measure_split(b: int, vllm_kernels: dict[str, Any], vllm_kernel: Any) -> dict[str, Any]:
    """Top-p 0.9 alone on ``b`` rows: the split pipelines (ours, vLLM's) and the monolithic kernels."""
    import cpu_impl.topk_topp as cpu
    import triton_impl.topk_topp as ours

    device = torch.device("cuda")
    num_sm = torch.cuda.get_device_properties(0).multi_processor_count
    src_host = logits(b)
    src = src_host.to(device)
    work = torch.empty_like(src)
    p = torch.full((b,), 0.9, device=device)
    ws = contracts.split_workspace(device)
    row: dict[str, Any] = {"rows": b, "slices": contracts.split_count(b, V, num_sm)}
    row["copy_ms"] = median_ms(lambda: work.copy_(src), True, 0)
    mine = {n: getattr(ours, n) for n in contracts.SPLIT_KERNELS}
    for name, kernels in (("ours_split", mine), ("vllm_split", vllm_kernels)):
        row[f"{name}_ms"] = median_ms(lambda k=kernels: (work.copy_(src), split_pipeline(k, work, p, num_sm, ws)), True, 0)
    programs = min(num_sm, b)
    for name, kernel in (("ours_monolithic", ours._topk_topp_kernel), ("vllm_monolithic", vllm_kernel)):
        a = launch_args(work, None, 0.9, programs)
        if name == "vllm_monolithic":
            a["PERCENTILE_TO_STD_TABLE"], a["NORMAL_CDF_TO_SIGMA_TABLE"] = vllm_tables(device)
        row[f"{name}_ms"] = median_ms(lambda k=kernel, a=a: (work.copy_(src), k[(programs,)](**a, num_warps=8)), True, 0)
    # Outputs: ours against the C++ port's split pipeline (logits and workspace bit for bit), and
    # the rows where vLLM's split pipeline keeps another set than C35.
    host = src_host.clone()
    host_ws = tuple(t.cpu() for t in ws)
    work.copy_(src)
    split_pipeline(mine, work, p, num_sm, ws)
    split_pipeline({n: getattr(cpu, n) for n in contracts.SPLIT_KERNELS}, host, p.cpu(), num_sm, host_ws)
    torch.cuda.synchronize()
    row["ours_equals_port"] = torch.equal(work.cpu().view(torch.int32), host.view(torch.int32))
    work.copy_(src)
    split_pipeline(vllm_kernels, work, p, num_sm, ws)
    torch.cuda.synchronize()
    row["vllm_split_rows_differing"] = int((kept(work.cpu()) != kept(host)).any(1).sum())
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--reps", type=int, default=5, help="CPU repetitions (the median is reported)")
    parser.add_argument("--split-rows", default="1,8,64", help="rows of the split top-p comparison (GPU only)")
    parser.add_argument("--out", default="reports/bench")
    ns = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    engine.use(engine.named() or "0.33.0")
    loader = engine.loader()
    pytorch_path = loader.kernel("vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch")
    vllm_kernel = loader.kernel("vllm.v1.sample.ops.topk_topp_triton._topk_topp_kernel") if cuda else None
    device = torch.device("cuda" if cuda else "cpu")
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    rows_out = [measure(b, mode, k, p, cuda, ns.reps, pytorch_path, vllm_kernel)
                for b in (int(r) for r in ns.rows.split(",")) for mode, (k, p) in MODES.items()]
    ok = all(r.get("triton_equals_port", True) for r in rows_out)
    probe: dict[str, Any] = {}
    if cuda:
        from triton_impl.topk_topp import _topk_topp_kernel as ours

        b = 128
        g = torch.Generator().manual_seed(1)
        x = torch.randn(b, V, generator=g) * 2.5
        x[torch.arange(b), torch.randint(0, V, (b,), generator=g)] = 35.0
        x = (x * 10).to(device)
        programs = min(torch.cuda.get_device_properties(0).multi_processor_count, b)
        for name, kernel in (("ours", ours), ("vllm", vllm_kernel)):
            a = launch_args(x.clone(), None, 0.9, programs)
            if name == "vllm":
                a["PERCENTILE_TO_STD_TABLE"], a["NORMAL_CDF_TO_SIGMA_TABLE"] = vllm_tables(device)
            kernel[(programs,)](**a, num_warps=8)
            torch.cuda.synchronize()
            n = kept(a["LOGITS"]).sum(1)
            probe[name] = {"rows_unmasked": int((n == V).sum()), "kept_min": int(n.min()), "kept_max": int(n.max())}
        print("overflow probe (128 rows, T = 0.1, p = 0.9):", json.dumps(probe), flush=True)
    lines = [f"{where}, torch {torch.__version__}; vocabulary {V}; medians in ms, each call including a fresh copy of the logits", "",
             "| rows | mode | copy | vLLM PyTorch path | " + ("ours (Triton) | vLLM Triton | " if cuda else "C++ port | ")
             + "rows where vLLM's PyTorch path keeps another set" + (" | rows where vLLM's Triton does |" if cuda else " |"),
             "|---|---|---|---|" + ("---|---|" if cuda else "---|") + ("---|---|" if cuda else "---|")]
    for r in rows_out:
        mid = (f"{r['triton_ms']:.3f} | {r['vllm_triton_ms']:.3f} | " if cuda else f"{r['cpp_port_ms']:.2f} | ")
        tail = f"{r['vllm_pytorch_rows_differing']}" + (f" | {r['vllm_triton_rows_differing']}" if cuda else "")
        lines.append(f"| {r['rows']} | {r['mode']} | {r['copy_ms']:.3f} | {r['vllm_pytorch_ms']:.3f} | {mid}{tail} |")
    split_out = []
    if cuda and ns.split_rows:
        vllm_split = {n: loader.kernel(f"vllm.v1.sample.ops.topk_topp_triton.{n}") for n in contracts.SPLIT_KERNELS}
        split_out = [measure_split(int(b), vllm_split, vllm_kernel) for b in ns.split_rows.split(",")]
        ok = ok and all(r["ours_equals_port"] for r in split_out)
        lines += ["", "Top-p 0.9 alone (vLLM's CUDA path: the split pipeline for <= 64 rows):", "",
                  "| rows | slices | copy | ours, split | vLLM, split | ours, monolithic | vLLM, monolithic | ours = port | "
                  "rows where vLLM's split keeps another set |", "|---|---|---|---|---|---|---|---|---|"]
        for r in split_out:
            lines.append(f"| {r['rows']} | {r['slices']} | {r['copy_ms']:.3f} | {r['ours_split_ms']:.3f} | {r['vllm_split_ms']:.3f} | "
                         f"{r['ours_monolithic_ms']:.3f} | {r['vllm_monolithic_ms']:.3f} | {r['ours_equals_port']} | "
                         f"{r['vllm_split_rows_differing']} |")
    text = "\n".join(lines)
    print(text)
    write_report(Path(ns.out), "topk-topp", text, {"device": where, "rows": rows_out, "overflow_probe": probe, "split": split_out})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
