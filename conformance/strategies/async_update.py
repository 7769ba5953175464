"""Batch changes for the async-scheduling update: new requests, requests that kept their slot or
moved, requests without drafts, duplicated previous positions, and counts near int32's top."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.strategies import cases_for, generator, seeds

INT32_MAX = 2**31 - 1


@cases_for("update_num_computed_tokens_for_batch_change")
def update_cases() -> st.SearchStrategy[Case]:
    return _update_cases()


@st.composite
def _update_cases(draw: st.DrawFn) -> Case:
    previous = draw(st.integers(0, 8))  # requests of the previous batch
    n = draw(st.integers(0, 8))  # requests of the new one
    g = generator(draw(seeds))
    # A request's previous slot (duplicates allowed), or negative: a new request.
    choices = st.one_of(st.integers(0, previous - 1), st.sampled_from([-1, -2])) if previous else st.sampled_from([-1, -2])
    prev = draw(st.lists(choices, min_size=n, max_size=n))
    slots = max(previous, n) + draw(st.integers(0, 3))  # the persistent per-slot buffer (max_num_reqs)
    computed = torch.randint(0, 1000, (slots,), generator=g, dtype=torch.int32)
    valid = torch.randint(0, 5, (previous,), generator=g, dtype=torch.int32)
    # Near int32's top the sum wraps, as the engine's int32 addition does.
    for i in draw(st.lists(st.integers(0, max(previous - 1, 0)), max_size=2 if previous else 0)):
        computed[i] = INT32_MAX - draw(st.integers(0, 3))
        event("count near int32's top")
    drafts = torch.randint(0, 4, (previous + draw(st.integers(0, 2)),), generator=g)
    if len(set(p for p in prev if p >= 0)) < len([p for p in prev if p >= 0]):
        event("duplicated previous position")
    args = dict(
        num_computed_tokens=computed,
        num_accepted_tokens=torch.randint(1, 5, (n,), generator=g, dtype=torch.int32),
        prev_positions=torch.tensor(prev, dtype=torch.int64).to(draw(st.sampled_from([torch.int64, torch.int32]))),
        valid_sampled_token_count=valid,
        prev_num_draft_tokens=drafts.to(draw(st.sampled_from([torch.int32, torch.int64]))),
        cpu_num_computed_tokens=torch.randint(0, 1000, (n,), generator=g, dtype=torch.int32),
    )
    return Case("update_num_computed_tokens_for_batch_change", args)
