"""The oracle of SGLang's speculative verification (docs/sglang_verify.md, C46-C48): the readable
specification.

``speculative_sampling_classic_kernel`` (K46): per request, a chain of ``NUM_SLOTS - 1`` drafts
(``Candidates[b, 1:]``), draft step ``s`` judged on row ``s - 1`` of p and q with coin
``UniformSamples[b, s - 1]``. Token by token, the chain stops at the first draft C46a rejects; under
``BLOCK_VERIFICATION`` the longest prefix C46e accepts is taken at once. The accepted drafts are
written at the path's slots, then one final token at the last accepted node's slot: drawn (C46d)
from p at row ``num`` when every draft was accepted (the bonus), else from the residual
``max(RN(scale * p) - q', 0)`` (C46c), ``VOCAB_SIZE - 1`` when the draw finds no token.

``verify_tree_greedy_kernel_triton`` (K47): level by level, the first child's sibling list is
searched for the target's argmax at the last accepted node; the walk stops at the first level with
no match (C47a). The last accepted node's slot takes the target there.

``tree_speculative_sampling_target_only`` (K48): level by level, siblings accumulate their target
probability against the level's coin (C48a); a rejected node's lane of ``draft_probs`` becomes its p
(C48c); the final token is drawn from ``max(p - draft_probs, 0)`` at the last accepted node (p alone
for the bonus), the last positive lane when the draw finds none (C48d).
"""

from __future__ import annotations

import torch

from contracts import sglang_verify as contract
from contracts.rejection import residual_weight


def speculative_sampling_classic_kernel(
    Predicts: torch.Tensor,
    AcceptIndex: torch.Tensor,
    AcceptTokenNum: torch.Tensor,
    Candidates: torch.Tensor,
    RetriveIndex: torch.Tensor,
    UniformSamples: torch.Tensor,
    UniformSamplesFinal: torch.Tensor,
    TargetProbs: torch.Tensor,
    DraftProbs: torch.Tensor,
    stride_cand_b: int,
    stride_cand_s: int,
    stride_idx_b: int,
    stride_idx_s: int,
    stride_uni_b: int,
    stride_uni_s: int,
    stride_tp_b: int,
    stride_tp_s: int,
    stride_tp_v: int,
    stride_dp_b: int,
    stride_dp_s: int,
    stride_dp_v: int,
    NUM_SLOTS: int,
    VOCAB_SIZE: int,
    BLOCK_V: int,
    BLOCK_VERIFICATION: bool = False,
    BLOCK_REDUCE: int = 4096,
) -> None:
    # The strides are the tensors' own (a precondition): the tensors are indexed directly, and no
    # result depends on BLOCK_V or BLOCK_REDUCE (C46d's sums are exact).
    a = locals()
    for b in range(contract.batch(a)):
        drafts = Candidates[b, :NUM_SLOTS].tolist()
        slots = RetriveIndex[b, :NUM_SLOTS].tolist()
        num, scale, total = contract.classic_decisions(a, b)
        AcceptIndex[b, 0] = slots[0]
        for s in range(1, num + 1):
            Predicts[slots[s - 1]] = drafts[s]
            AcceptIndex[b, s] = slots[s]
        AcceptTokenNum[b] = num
        token = contract.draw(contract.classic_final_units(a, b, num, scale), UniformSamplesFinal[b], total)
        Predicts[slots[num]] = VOCAB_SIZE - 1 if token is None else token


def verify_tree_greedy_kernel_triton(
    predicts_ptr: torch.Tensor,
    accept_index_ptr: torch.Tensor,
    accept_token_num_ptr: torch.Tensor,
    candidates_ptr: torch.Tensor,
    retrieve_index_ptr: torch.Tensor,
    retrieve_next_token_ptr: torch.Tensor,
    retrieve_next_sibling_ptr: torch.Tensor,
    target_predict_ptr: torch.Tensor,
    batch_size: int,
    num_speculative_tokens: int,
    num_draft_tokens: int,
) -> None:
    target = target_predict_ptr.reshape(-1).tolist()  # read at a node's slot (flat)
    for b in range(batch_size):
        slot = retrieve_index_ptr[b].tolist()
        child, sibling = retrieve_next_token_ptr[b].tolist(), retrieve_next_sibling_ptr[b].tolist()
        token = candidates_ptr[b].tolist()
        last, num, cur = slot[0], 0, 0
        accept_index_ptr[b, 0] = last
        for _ in range(1, num_speculative_tokens):
            cur = child[cur]
            want = target[last]
            while cur != -1 and token[cur] != want:  # every sibling list ends at -1 (C47b)
                cur = sibling[cur]
            if cur == -1:
                break
            predicts_ptr[last] = want
            num += 1
            accept_index_ptr[b, num] = slot[cur]
            last = slot[cur]
        accept_token_num_ptr[b] = num
        predicts_ptr[last] = target[last]


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    bs, _, spec, v = contract.target_only_shape(locals())
    for b in range(bs):
        slot = retrive_index[b].tolist()
        child, sibling = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        token = candidates[b].tolist()
        row, coin, prob_acc = 0, uniform_samples[b, 0], torch.tensor(0.0)
        last, num, cur = slot[0], 0, 0
        accept_index[b, 0] = last
        for _ in range(1, spec):
            cur = child[cur]
            while cur != -1:  # every sibling list ends at -1 (C47b)
                d = token[cur]
                p = target_probs[b, row, d]
                prob_acc = prob_acc + p  # float32, running over the level's siblings
                if bool(contract.target_only_accepts(p, prob_acc, coin, threshold_single, threshold_acc)):
                    prob_acc = torch.tensor(0.0)
                    row, coin = cur, uniform_samples[b, cur]
                    predicts[last] = d
                    num += 1
                    accept_index[b, num] = slot[cur]
                    last = slot[cur]
                    break
                draft_probs[b, row, d] = p  # C48c: the rejected lane takes p (an input mutation)
                cur = sibling[cur]
            if cur == -1:
                break
        accept_token_num[b] = num
        p_row = target_probs[b, row]
        w = p_row if num == spec - 1 else residual_weight(p_row - draft_probs[b, row])
        found = contract.draw(contract.units(w), uniform_samples_for_final_sampling[b])
        if found is None:  # C48d: the last positive lane, else V - 1
            positive = (w > 0).nonzero()
            found = int(positive[-1]) if positive.numel() else v - 1
        predicts[last] = found
