"""The oracle of vLLM's CPU sampler ops (docs/argmax.md, C40): the readable specification.

``greedy_argmax``: each row's token is torch.argmax's: the first NaN if the row holds one, else the
first maximum (-0.0 equals 0.0).

``fused_gumbel_argmax``: Gumbel-max sampling of softmax(row) with a counter-based stream. Token i of
a row draws ``d = splitmix64(splitmix64(seed) + (i + 1) * GAMMA) >> 11`` (53 bits; the contract's
``draws``), ``u = (d + 0.5) * 2**-53`` in float64 and noise ``g = -log(-log(u))`` with the C
library's float64 log (C29's float64 clause); the top draw's u, 1 - 2**-54, is no float64, and its
noise is -log(2**-54), every draw's noise below 37.5. The row is scanned left to right in float64:
a token whose logit is -inf is skipped; the first other token becomes the best; a later token
replaces the best (logit ``bx``, noise ``bg``) when ``(x - bx) + g > bg``, each operation rounded
once. The comparison in (logit, noise) space keeps the noise of a token next to a logit of 1e38. A
row of -inf only gives token 0. Nothing is skipped by a bound: vLLM prunes the scan (the noise
bound, then an exp test) and the contract holds the pruned scan to the full one.
"""

from __future__ import annotations

import math

import torch

from contracts.argmax import TOP_DRAW, draws


def greedy_argmax(sampled: torch.Tensor, logits: torch.Tensor) -> None:
    for b, row in enumerate(logits):
        nan = torch.isnan(row).nonzero()
        if nan.numel():
            sampled[b] = int(nan[0])
        else:
            sampled[b] = int((row == row.max()).nonzero()[0])


def _noise(d: int) -> float:
    # float(d) is exact (d < 2**53); the sum rounds to nearest even. The top draw's u, 1 - 2**-54, is
    # no float64 (it would round to 1.0 and give +inf): its -log(u) is 2**-54 to float64 precision.
    minus_log_u = 2.0**-54 if d == TOP_DRAW else -math.log((float(d) + 0.5) * 2.0**-53)
    return -math.log(minus_log_u)


def fused_gumbel_argmax(sampled: torch.Tensor, logits: torch.Tensor, seeds: torch.Tensor) -> None:
    vocab = logits.shape[1]
    for b in range(logits.shape[0]):
        drew = draws(int(seeds[b]), vocab).tolist()
        best, best_x, best_g = 0, 0.0, 0.0
        seen = False
        for i, x in enumerate(logits[b].double().tolist()):
            if x == -math.inf:
                continue
            g = _noise(drew[i])
            if not seen or (x - best_x) + g > best_g:
                best, best_x, best_g, seen = i, x, g, True
        sampled[b] = best
