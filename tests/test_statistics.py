"""Statistical properties of the random path (docs/spec.md §3.5, §3.7).

Every test is a chi-square goodness-of-fit test at a false-alarm rate ALPHA per test. Its
sample size comes from a power analysis: the smallest N at which a deviation of Cohen's
effect size W is detected with probability POWER (noncentral chi-square, lambda = N W^2).
Seeds are fixed, so a run is reproducible; each test also shows it can fail, by feeding the
same statistic a sample from the wrong distribution.

The Triton backend is omitted here: interpreted, one program per request is too slow for
N in the tens of thousands, and conformance already shows it agrees exactly with the other
two on shared randomness.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from compositions.sampler import SamplingMetadata, rejection_sample, unconditional_to_conditional_rates

ALPHA = 1e-3  # false alarms: one run in a thousand per test
POWER = 0.99
W = 0.05  # Cohen's w: small effect


def sample_size(categories: int, w: float = W, alpha: float = ALPHA, power: float = POWER) -> int:
    df = categories - 1
    critical = stats.chi2.ppf(1 - alpha, df)
    n = 100
    while stats.ncx2.sf(critical, df, n * w * w) < power:
        n = int(n * 1.05) + 1
    return n


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() / probs.double().sum() * counts.sum()
    return float(stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue)


P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])  # target
Q = torch.tensor([0.10, 0.10, 0.30, 0.30, 0.10, 0.10])  # drafter


def emitted_first_tokens(backend: str, n: int, draft_probs: bool, fp64: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = len(P)
    draft = torch.multinomial(Q, n, replacement=True, generator=g).to(torch.int32)
    out = rejection_sample(
        draft, [1] * n, 1, torch.arange(1, n + 1, dtype=torch.int32),
        Q.expand(n, v).contiguous() if draft_probs else None,
        P.log().expand(n, v).contiguous(), torch.zeros(n, 1, dtype=torch.int32),
        SamplingMetadata(torch.ones(n), all_greedy=False, all_random=True), use_fp64_gumbel=fp64, backend=backend,
        uniform=torch.rand(n, dtype=torch.float64, generator=g),
        noise=torch.empty(n, v, dtype=torch.float64 if fp64 else torch.float32).exponential_(generator=g),
    )
    return torch.bincount(out[:, 0].long(), minlength=v)


def test_power_analysis_sizes():
    assert 5000 < sample_size(len(P)) < 20000


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("fp64", [False, True])
def test_random_path_preserves_the_target_distribution(backend, fp64):
    """Speculative sampling's guarantee: with drafts from q, the emitted token is distributed as p."""
    n = sample_size(len(P))
    counts = emitted_first_tokens(backend, n, draft_probs=True, fp64=fp64, seed=1234)
    target = torch.softmax(P.log(), -1)
    assert p_value(counts, target) > ALPHA
    # The same test rejects the drafter's distribution, which a sampler that accepted every draft would emit.
    assert p_value(counts, Q) < ALPHA


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_one_hot_drafts_also_preserve_the_target(backend):
    """NO_DRAFT_PROBS: q is one-hot at the draft; accept with p(d), else sample p without d."""
    counts = emitted_first_tokens(backend, sample_size(len(P)), draft_probs=False, fp64=False, seed=99)
    assert p_value(counts, torch.softmax(P.log(), -1)) > ALPHA


UNCONDITIONAL = [0.9, 0.5, 0.2]


def acceptance_lengths(backend: str, n: int, greedy: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k, v = len(UNCONDITIONAL), 8
    # Out-of-vocabulary drafts are written verbatim when accepted (C11), so accepted cells are unmistakable.
    draft = torch.full((n * k,), v + 100, dtype=torch.int32)
    logits = torch.randn(n * k, v, generator=g)
    out = rejection_sample(
        draft, [k] * n, k, torch.arange(k, n * k + 1, k, dtype=torch.int32), None, logits,
        torch.zeros(n, 1, dtype=torch.int32),
        SamplingMetadata(None if greedy else torch.ones(n), all_greedy=greedy, all_random=not greedy),
        synthetic_mode=True, synthetic_conditional_rates=unconditional_to_conditional_rates(UNCONDITIONAL),
        backend=backend, uniform=torch.rand(n * k, dtype=torch.float64, generator=g),
        noise=torch.empty(n, v).exponential_(generator=g),
    )
    accepted = (out[:, :k] >= v).int()
    length = accepted.cumprod(dim=1).sum(dim=1)  # drafts accepted before the first rejection
    return torch.bincount(length, minlength=k + 1)


def length_distribution(rates: list[float]) -> torch.Tensor:
    a = [1.0, *rates, 0.0]
    return torch.tensor([a[i] - a[i + 1] for i in range(len(rates) + 1)])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("greedy", [True, False])
def test_synthetic_mode_reproduces_the_configured_acceptance_rates(backend, greedy):
    n = sample_size(len(UNCONDITIONAL) + 1)
    counts = acceptance_lengths(backend, n, greedy, seed=7)
    assert p_value(counts, length_distribution(UNCONDITIONAL)) > ALPHA
    assert p_value(counts, length_distribution([0.85, 0.45, 0.15])) < ALPHA  # a slightly wrong rate is caught


# -- Model Runner V2 (docs/mrv2.md): randomness reproduced from seeds and positions ----------------------
def mrv2_run(n: int, k: int, draft_logits: bool, seed: int, **options: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sampled, num_sampled, drafts)`` of n requests with k drafts from q each, on the C++ port
    (temperature 1, the target p at every row; each request in its own slot with its own seed and
    positions). ``options``: use_fp64, use_block_verification."""
    from compositions.sampler import mrv2_rejection_sample

    g = torch.Generator().manual_seed(seed)
    v, rows = len(P), (k + 1) * n
    drafts = torch.multinomial(Q, k * n, replacement=True, generator=g).to(torch.int32).view(n, k)
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int32), drafts], 1).reshape(-1)  # rows r(k+1) + 1.. hold r's drafts
    sampled, num_sampled = mrv2_rejection_sample(
        P.log().expand(rows, v).contiguous(), Q.log().expand(n, k, v).contiguous() if draft_logits else None, tokens,
        torch.arange(0, rows + 1, k + 1, dtype=torch.int32), torch.randint(0, 2**40, (rows,), generator=g), torch.arange(n),
        torch.arange(n).repeat_interleave(k + 1), torch.arange(k + 1, dtype=torch.int32).repeat(n), torch.ones(n),
        torch.randint(-(2**63), 2**63 - 1, (n,), generator=g), k, backend="cpu", **options)
    return sampled, num_sampled, drafts


@pytest.mark.parametrize("draft_logits, block, fp64", [
    (True, False, False), (True, False, True), (False, False, False), (True, True, False), (False, True, False),
], ids=["draft-logits", "float64-noise", "one-hot", "block-verification", "block-one-hot"])
def test_mrv2_preserves_the_target_distribution(draft_logits, block, fp64):
    """MRV2's first emitted token is distributed as p: with or without draft logits, under block
    verification, with float32 or float64 noise. The same statistic rejects the drafter's q. Run
    on the C++ port (the oracle's per-request loops take a minute at this N; conformance holds the
    two to the same bits)."""
    sampled, _, _ = mrv2_run(sample_size(len(P)), 1, draft_logits, 2024, use_fp64=fp64, use_block_verification=block)
    counts = torch.bincount(sampled[:, 0], minlength=len(P))
    assert p_value(counts, P) > ALPHA
    assert p_value(counts, Q) < ALPHA


@pytest.mark.parametrize("draft_logits", [True, False], ids=["draft-logits", "one-hot"])
def test_mrv2_acceptance_rate_is_the_overlap(draft_logits):
    """A draft from q is accepted with probability sum min(p, q) (draft logits), or sum q p (one-hot:
    q is the point mass at the draft). Two-sided binomial test at ALPHA; it rejects a rate off by 0.03."""
    n = sample_size(len(P))
    _, num_sampled, _ = mrv2_run(n, 1, draft_logits, 7)
    accepted = int((num_sampled == 2).sum())  # the draft and the bonus token
    rate = float(torch.minimum(P, Q).sum()) if draft_logits else float((P * Q).sum())
    assert stats.binomtest(accepted, n, rate).pvalue > ALPHA
    assert stats.binomtest(accepted, n, rate + 0.03).pvalue < ALPHA


@pytest.mark.parametrize("draft_logits", [True, False], ids=["draft-logits", "one-hot"])
def test_mrv2_second_position_follows_the_target(draft_logits):
    """Two drafts from q per request, the target p at every row: among requests whose first draft was
    accepted, the token emitted at position 1 (the second draft, its resample or the bonus) is
    distributed as p too (standard verification: each step's draws are its own)."""
    v, rate = len(P), float(torch.minimum(P, Q).sum()) if draft_logits else float((P * Q).sum())
    n = int(sample_size(v) / rate) + 1  # enough requests that about sample_size(v) reach position 1
    sampled, num_sampled, _ = mrv2_run(n, 2, draft_logits, 11)
    second = sampled[num_sampled >= 2, 1]
    assert second.numel() > 0.9 * sample_size(v)
    counts = torch.bincount(second, minlength=v)
    assert p_value(counts, P) > ALPHA
    assert p_value(counts, Q) < ALPHA


def test_mrv2_block_verification_accepts_at_least_as_much():
    """Standard verification accepts sum_{j<=k} a^j drafts on average (a = sum min(p, q), independent
    steps): a z-test at ALPHA. Block verification accepts at least as many (Sun et al., 2024): a
    one-sided Welch test at ALPHA finds no shortfall, and the same test flags a sampler that accepted
    one draft fewer."""
    n, k = 20000, 3
    a = float(torch.minimum(P, Q).sum())
    standard = mrv2_run(n, k, True, 5)[1].double() - 1
    block = mrv2_run(n, k, True, 6, use_block_verification=True)[1].double() - 1
    mean = sum(a**j for j in range(1, k + 1))
    z = (float(standard.mean()) - mean) / (float(standard.std()) / n**0.5)
    assert abs(z) < stats.norm.ppf(1 - ALPHA / 2)
    assert stats.ttest_ind(block, standard, equal_var=False, alternative="less").pvalue > ALPHA
    assert stats.ttest_ind(block - 1, standard, equal_var=False, alternative="less").pvalue < ALPHA


def test_mrv2_synthetic_mode_reproduces_the_configured_acceptance_rates():
    """MRV2's synthetic mode accepts draft i with the configured conditional rate, from its own Philox
    uniform: the accepted lengths follow the unconditional rates, and a slightly wrong rate is caught."""
    k = len(UNCONDITIONAL)
    n = sample_size(k + 1)
    rates = torch.tensor(unconditional_to_conditional_rates(UNCONDITIONAL), dtype=torch.float32)
    _, num_sampled, _ = mrv2_run(n, k, True, 13, synthetic_conditional_rates=rates)
    counts = torch.bincount(num_sampled.long() - 1, minlength=k + 1)
    assert p_value(counts, length_distribution(UNCONDITIONAL)) > ALPHA
    assert p_value(counts, length_distribution([0.85, 0.45, 0.15])) < ALPHA


def test_mrv2_residual_noise_is_independent_of_the_acceptance_uniform():
    """A rejected draft is replaced by a sample of the residual max(p - q, 0), which with draft logits
    does not depend on the draft: the resampled token must be independent of the acceptance uniform
    (Philox) that rejected it, its noise coming from another stream (murmur3). Chi-square test of
    independence between the uniform's half and the token, at ALPHA; it flags a sampler whose token
    follows the uniform."""
    from reference.gumbel import tl_rand32

    n = sample_size(len(P)) * 3
    g = torch.Generator().manual_seed(17)
    drafts = torch.multinomial(Q, n, replacement=True, generator=g).to(torch.int32).view(n, 1)
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int32), drafts], 1).reshape(-1)
    pos = torch.randint(0, 2**40, (2 * n,), generator=g)
    seed = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)
    from compositions.sampler import mrv2_rejection_sample

    sampled, num_sampled = mrv2_rejection_sample(
        P.log().expand(2 * n, len(P)).contiguous(), Q.log().expand(n, 1, len(P)).contiguous(), tokens,
        torch.arange(0, 2 * n + 1, 2, dtype=torch.int32), pos, torch.arange(n), torch.arange(n).repeat_interleave(2),
        torch.arange(2, dtype=torch.int32).repeat(n), torch.ones(n), seed, 1, backend="cpu")
    rejected = num_sampled == 1
    u = tl_rand32(seed, pos[0::2], includes_zero=False)  # the uniform that tested each request's draft
    high = (u >= u[rejected].median())[rejected].long()
    token = sampled[rejected, 0].long()
    assert int(rejected.sum()) > 0.3 * n and set(token.unique().tolist()) <= {0, 1}  # the residual's support

    def independence(high: torch.Tensor, token: torch.Tensor) -> float:
        table = torch.zeros(2, 2, dtype=torch.float64)
        table.index_put_((high, token), torch.ones_like(high, dtype=torch.float64), accumulate=True)
        return float(stats.chi2_contingency(table.numpy()).pvalue)

    assert independence(high, token) > ALPHA
    follows = torch.where(torch.rand(high.numel(), generator=g) < 0.1, high, token)  # a 10 % leak of u
    assert independence(high, follows) < ALPHA
