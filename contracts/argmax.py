"""Contract of vLLM's CPU sampler ops (docs/argmax.md, C40; vLLM's csrc/cpu/sampling_kernels.cpp).

On a CPU every token vLLM's V1 sampler draws ends in one of two C++ ops of its CPU build:
``greedy_argmax`` (``Sampler.greedy_sample``, more than one row) and ``fused_gumbel_argmax``
(``TopKTopPSampler.forward_cpu``: every random row, bonus tokens included). They are not Triton
kernels: vLLM calls ``torch.ops._C.<op>(...)`` and takes the returned tensor. Here each takes the
op's inputs in order and writes the returned token ids into ``sampled``; there is no Triton form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from contracts.spec import KernelSpec, Role, ptr, require

F32, I64 = torch.float32, torch.int64
K34, K35 = "greedy_argmax", "fused_gumbel_argmax"
# vLLM's seeds at the call site: torch.randint(0, 2**31) per row, or the request generator's draw.
CALL_SITE_SEEDS = 2**31

# The random stream (C40): SplitMix64's increment and finalizer; a draw is the top 53 bits.
GAMMA = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
M64 = 2**64 - 1
TOP_DRAW = 2**53 - 1  # its u, 1 - 2**-54, is no float64: (TOP_DRAW + 0.5) * 2**-53 rounds to 1.0


def splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of uint64 words (arithmetic modulo 2**64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX[0])
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX[1])
        return z ^ (z >> np.uint64(31))


def draws(seed: int, vocab: int) -> np.ndarray:
    """Every token's 53-bit draw for one row: token i draws splitmix64(key + (i + 1) * GAMMA) >> 11,
    where key = splitmix64(seed) and the int64 seed is read as uint64."""
    key = splitmix64(np.array([seed & M64], dtype=np.uint64))
    with np.errstate(over="ignore"):
        counters = key + np.arange(1, vocab + 1, dtype=np.uint64) * np.uint64(GAMMA)
    return splitmix64(counters) >> np.uint64(11)


def _preconditions(name: str) -> Any:
    def check(a: Mapping[str, Any]) -> None:
        logits, sampled = a["logits"], a["sampled"]
        require(logits.shape[1] >= 1, name, "logits", f"must have at least one column (a vocabulary), has shape {tuple(logits.shape)}")
        require(sampled.numel() == logits.shape[0], name, "sampled",
                f"must hold one id per row of logits ({logits.shape[0]}), has {sampled.numel()}")
        if "seeds" in a:
            seeds = a["seeds"]
            require(seeds.numel() == logits.shape[0], name, "seeds",
                    f"must hold one seed per row of logits ({logits.shape[0]}), has {seeds.numel()}")

    return check


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    row = a["logits"][index]
    finite = row[torch.isfinite(row)]
    line = (f"row {index}: V={row.numel()}, max {float(row.max())!r} at {int(row.argmax())}, "
            f"{int(torch.isnan(row).sum())} NaN, {int((row == float('inf')).sum())} +inf, "
            f"{int((row == float('-inf')).sum())} -inf, {finite.numel()} finite")
    if "seeds" in a:
        line += f"; seed {int(a['seeds'][index])}"
    return line


def _rule(name: str) -> Any:
    def rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
        row = a["logits"][index]
        if name == K35 and bool((draws(int(a["seeds"][index]), row.numel()) >= TOP_DRAW - 7).any()):
            return "C40 a draw near the top"
        if bool(torch.isnan(row).any()):
            return "C40 NaN logits"
        return "C40 first maximum" if name == K34 else "C40 Gumbel scan"

    return rule


def _bytes(a: Mapping[str, Any]) -> int:
    n = a["logits"].numel() * 4 + a["sampled"].numel() * 8
    return n + (a["seeds"].numel() * 8 if "seeds" in a else 0)


def _call_site(a: Mapping[str, Any]) -> bool:
    return "seeds" not in a or bool(((a["seeds"] >= 0) & (a["seeds"] < CALL_SITE_SEEDS)).all())


_SAMPLED = ptr("sampled", (I64,), I64, "[B] the op's returned token ids", role=Role.OUT)
_LOGITS = ptr("logits", (F32,), F32, "[B, V] float32 logits, rows at any stride (unit inner stride)", ndim=(2,), contiguous=False)

GREEDY_ARGMAX = KernelSpec(
    name=K34,
    family="argmax",
    qualname=f"torch.ops._C.{K34}",
    params=(_SAMPLED, _LOGITS),
    grid=lambda a: (1,),
    preconditions=_preconditions(K34),
    explain=_explain,
    rule=_rule(K34),
    bytes_moved=_bytes,
    host=True,
)

FUSED_GUMBEL_ARGMAX = KernelSpec(
    name=K35,
    family="argmax",
    qualname=f"torch.ops._C.{K35}",
    params=(_SAMPLED, _LOGITS, ptr("seeds", (I64,), I64, "[B] a seed per row (any int64; the call site draws [0, 2**31))")),
    grid=lambda a: (1,),
    preconditions=_preconditions(K35),
    explain=_explain,
    rule=_rule(K35),
    call_site=_call_site,
    bytes_moved=_bytes,
    host=True,
)

SPECS = (GREEDY_ARGMAX, FUSED_GUMBEL_ARGMAX)
