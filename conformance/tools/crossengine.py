"""``specdiff crossengine``: one draft, its probabilities and its coin, verified by both engines.

Each case is one request with one draft ``d`` over a small vocabulary: the target row ``p``, the
draft row ``q`` and the coin ``u``. vLLM's V1 verifier (``rejection_random_sample_kernel``, K2;
docs/spec.md C6-C10) and SGLang's chain sampler (``speculative_sampling_classic_kernel``, K46;
docs/sglang_verify.md C46) each decide it under their own contract (the oracles), and, where the
engine is named (``--vllm``, ``--sglang``), with the engine's own kernel. The table shows where the
two engines accept differently, and the named decision that says why; the decisions are the
contracts' (each engine is held to its own), so a difference between the engines is a documented
decision, never a failure. Exit status 1 when an engine's kernel decides a case otherwise than its
own contract, 2 on bad arguments.

    specdiff crossengine [--vllm 0.33.0] [--sglang 0.5.23] [--report reports/crossengine.md]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

K2, K46 = "rejection_random_sample_kernel", "speculative_sampling_classic_kernel"


@dataclass(frozen=True)
class Case:
    id: str
    decision: str  # the named decision behind the engines' difference (or "agree")
    p: tuple[float, ...]  # the target's row; the draft is token 0
    q: tuple[float, ...]  # the drafter's row
    u: float  # the coin: vLLM's uniform, SGLang's UniformSamples; exactly a float32


# The decisive cases of docs/sglang_verify.md, as data. Every coin is a float32 value, so both engines
# read the same number (vLLM's uniform is float64, SGLang's coin float32).
CASES = (
    Case("SD1", "C46a strict boundary: SGLang accepts iff u*q < p, vLLM iff p/q >= u (C8)", (0.25, 0.75), (0.5, 0.5), 0.5),
    Case("SD2", "C46a zero target mass at coin 0: vLLM's 0/q >= 0 accepts (C9), SGLang's 0 < 0 does not",
         (0.0, 1.0), (0.5, 0.5), 0.0),
    Case("SD3", "C46a the rounded product, not the rounded quotient: RN(u*q) = p exactly",
         (0.6494157314300537, 0.3505842685699463), (0.9879068732261658, 0.012093126773834229), 0.6573653221130371),
    Case("SD3'", "C46a the rounded product again: RN(p/q) = u, u*q exceeds p",
         (0.7294965386390686, 0.2705034613609314), (0.8075826168060303, 0.1924173831939697), 0.9033088684082031),
    Case("SD4", "C46a SGLang rejects q above 1 (a drafter's broken row); vLLM's ratio .6 >= .5 accepts",
         (0.9, 0.1), (1.5, 0.0), 0.5),
    Case("SD5", "agree: q = 0 rejects on both (C9; C46a's 0 < q)", (0.3, 0.7), (0.0, 1.0), 0.0),
    Case("ctl-accept", "agree: p/q = 2 above any coin", (0.5, 0.5), (0.25, 0.75), 0.9),
    Case("ctl-reject", "agree: p/q = .5 below the coin", (0.25, 0.75), (0.5, 0.5), 0.75),
)


def vllm_args(c: Case) -> dict[str, Any]:
    """K2's launch for the case: one request, draft token 0, bonus 1, recovered 1 (never read on accept)."""
    v = len(c.p)
    return dict(output_token_ids_ptr=torch.full((1, 2), -1, dtype=torch.int32), cu_num_draft_tokens_ptr=torch.tensor([1], dtype=torch.int32),
                draft_token_ids_ptr=torch.tensor([0], dtype=torch.int32), draft_probs_ptr=torch.tensor([c.q], dtype=torch.float32),
                target_probs_ptr=torch.tensor([c.p], dtype=torch.float32), bonus_token_ids_ptr=torch.tensor([[1]], dtype=torch.int32),
                recovered_token_ids_ptr=torch.tensor([1], dtype=torch.int32), uniform_probs_ptr=torch.tensor([c.u], dtype=torch.float64),
                is_greedy_ptr=torch.tensor([False]), max_spec_len=1, vocab_size=v, synthetic_conditional_rates_ptr=None,
                NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False)


def sglang_args(c: Case) -> dict[str, Any]:
    """K46's launch at SGLang's call-site layout: one request, root and draft token 0, the bonus row
    uniform, final coin .5."""
    v = len(c.p)
    tp = torch.tensor([[c.p, [1.0 / v] * v]], dtype=torch.float32)
    dp = torch.tensor([[c.q]], dtype=torch.float32)
    cand, idx = torch.tensor([[0, 0]]), torch.arange(2).view(1, 2)
    uni = torch.tensor([[c.u, 0.5]], dtype=torch.float32)
    return dict(Predicts=torch.zeros(2, dtype=torch.int32), AcceptIndex=torch.full((1, 2), -1, dtype=torch.int32),
                AcceptTokenNum=torch.zeros(1, dtype=torch.int32), Candidates=cand, RetriveIndex=idx, UniformSamples=uni,
                UniformSamplesFinal=torch.tensor([0.5]), TargetProbs=tp, DraftProbs=dp, stride_cand_b=2, stride_cand_s=1,
                stride_idx_b=2, stride_idx_s=1, stride_uni_b=2, stride_uni_s=1, stride_tp_b=2 * v, stride_tp_s=v, stride_tp_v=1,
                stride_dp_b=v, stride_dp_s=v, stride_dp_v=1, NUM_SLOTS=2, VOCAB_SIZE=v, BLOCK_V=4096, BLOCK_VERIFICATION=False,
                BLOCK_REDUCE=4)


def decide(backend: str, kernel: str, c: Case) -> str:
    """``accept``, ``reject``, or ``refused: <why>`` (outside that engine's contract)."""
    from compositions.sampler import launch

    a = vllm_args(c) if kernel == K2 else sglang_args(c)
    try:
        launch(backend, kernel, (1,), **a)
    except (ValueError, TypeError) as e:
        return f"refused: {str(e).split(':', 1)[-1].strip()[:60]}"
    accepted = int(a["output_token_ids_ptr"][0, 0]) == 0 if kernel == K2 else int(a["AcceptTokenNum"][0]) == 1
    return "accept" if accepted else "reject"


def _departure(backend: str, kernel: str, c: Case) -> str | None:
    """The declared departure (conformance/departures.py) that explains an engine kernel deciding the
    case otherwise than its contract (compiled vLLM's approximate p/q near the coin: C6), or None."""
    from conformance import departures
    from conformance.backends import BACKENDS

    a = vllm_args(c) if kernel == K2 else sglang_args(c)
    output = "output_token_ids_ptr" if kernel == K2 else "AcceptTokenNum"
    d = departures.match(kernel, BACKENDS[backend].mode(), a, output, 0)
    return d.id if d is not None else None


def table(engines: dict[str, str]) -> tuple[list[dict[str, str]], bool]:
    """Every case's decisions: each contract's, and each named engine's own kernel's; whether every
    engine kernel agreed with its contract."""
    rows, ok = [], True
    for c in CASES:
        row = {"id": c.id, "p": f"{c.p[0]:.9g}", "q": f"{c.q[0]:.9g}", "u": f"{c.u:.9g}", "decision": c.decision,
               "vLLM contract": decide("reference", K2, c), "SGLang contract": decide("reference", K46, c)}
        for backend, title, kernel, contract in (("vllm", "vLLM kernel", K2, "vLLM contract"),
                                                  ("sglang", "SGLang kernel", K46, "SGLang contract")):
            if backend in engines:
                row[title] = decide(backend, kernel, c)
                if row[title] != row[contract]:
                    why = _departure(backend, kernel, c)
                    row[title] += f" (departs {why})" if why else " (a finding)"
                    ok = ok and why is not None
        rows.append(row)
    return rows, ok


def markdown(rows: list[dict[str, str]]) -> str:
    cols = [k for k in rows[0] if k != "decision"] + ["decision"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[k] for k in cols) + " |" for r in rows]
    return "\n".join(lines)


def cmd(ns: argparse.Namespace) -> int:
    from conformance import engine
    from conformance.backends import BACKENDS

    engines = {}
    if ns.vllm:
        engine.use(ns.vllm)
        engine.located()
        engines["vllm"] = ns.vllm
    if ns.sglang:
        from conformance.engine.sglang import SGLANG

        SGLANG.use(ns.sglang)
        SGLANG.located()
        engines["sglang"] = ns.sglang
    for name in engines:
        why = BACKENDS[name].unavailable()
        if why is not None:
            raise ValueError(f"--{name}: {why}")
    rows, ok = table(engines)
    text = markdown(rows)
    print(text)
    if ns.report:
        Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.report).write_text(text + "\n")
    if not ok:
        print("an engine's kernel decided a case otherwise than its own contract (above)")
    return 0 if ok else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("crossengine", help="one draft, probabilities and coin verified by vLLM and SGLang: where they differ")
    p.add_argument("--vllm", metavar="VERSION|PATH", help="also run vLLM's own K2")
    p.add_argument("--sglang", metavar="VERSION|PATH", help="also run SGLang's own K46")
    p.add_argument("--report", help="write the table (markdown) here")
    p.set_defaults(func=cmd)
