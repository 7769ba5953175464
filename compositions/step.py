"""One Model Runner V2 speculative-decoding step, as vLLM 0.33.0's model runner chains its kernels,
composed over any backend (docs/input_batch.md, docs/target_dependent_ar.md).

A step of ``MRV2Engine.step`` runs, on the backend asked for: the batch layout (K28 when drafts
are scheduled, K22 when a request prefills, K23, K24); the forward pass's block tables (K32, two
KV-cache groups, one of them a sliding window, rows padded as CUDA graphs pad them) and the
target's slot mappings (K33); a stub target model's logits at the logits rows; the rejection
sampler (K11, then K13-K18 through ``mrv2_rejection_sample``) and K25; the commit (K26); then the
EAGLE drafter (K29, a stub draft model's first draft, K30, and per further draft step its slot
mappings, K33, and K31), whose drafts the next step verifies. Between steps a host scheduler
admits requests into free state rows, gives them KV blocks, schedules prompt chunks and decode
rows, and frees finished requests and their blocks, reading the device state as it goes: so a
backend that computes one value differently changes every step after it.

The stub models are plain PyTorch functions of each row's token and position (never of the
backend), so two backends whose kernels agree produce the same steps bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from compositions.sampler import launch, mrv2_rejection_sample
from contracts.spec import Table, cdiv, next_power_of_2

I32, I64 = torch.int32, torch.int64
# The KV-cache groups: (tokens per block, sliding-window reach; 0: full attention).
GROUPS = ((4, 0), (8, 4))


@dataclass(frozen=True)
class Request:
    """A request of the plan: it arrives at step ``arrives``, prefills ``prompt`` and is finished once
    it has emitted ``max_tokens`` tokens (the step that passes it frees its state row)."""

    arrives: int
    prompt: tuple[int, ...]
    max_tokens: int
    seed: int = 0


@dataclass
class MRV2Engine:
    """The device state of Model Runner V2 (``RequestState``, the drafter's buffers) and its host
    scheduler, stepping ``plan`` over ``backend``'s kernels."""

    plan: list[Request]
    backend: str
    k: int = 3  # num_speculative_steps
    vocab: int = 64
    max_num_reqs: int = 4
    max_model_len: int = 96
    chunk: int = 7  # prompt tokens a prefilling request is scheduled per step
    hidden: int = 8
    steps: int = 0
    rows: dict[int, int] = field(default_factory=dict)  # plan index -> its state row, while active
    finished: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        r, k = self.max_num_reqs, self.k
        self.all_token_ids = torch.zeros((r, self.max_model_len), dtype=I32)
        self.prefill_len = torch.zeros(r, dtype=I32)
        self.num_computed = torch.zeros(r, dtype=I32)
        self.total_len = torch.zeros(r, dtype=I32)
        self.last_sampled = torch.zeros((r, 1), dtype=I64)
        self.draft_tokens = torch.zeros((r, k), dtype=I64)
        self.next_prefill_tokens = torch.zeros((1, r), dtype=I32)
        self.output_bin_counts = torch.zeros((r, self.vocab), dtype=I32)
        self.temperature = torch.ones(r, dtype=torch.float32)
        self.seeds = torch.zeros(r, dtype=I64)
        g = torch.Generator().manual_seed(1234)
        self._embedding = torch.randn((self.vocab, self.vocab), generator=g)
        # BlockTables: each group's table by state row, the blocks each row holds, the forward pass's
        # tables, and the host's free blocks (block 0 is the null block, never handed out).
        widths = [cdiv(self.max_model_len, size) for size, _ in GROUPS]
        self.block_tables = Table(torch.zeros((r, w), dtype=I32) for w in widths)
        self.input_block_tables = Table(torch.zeros((r, w), dtype=I32) for w in widths)
        self.block_widths = torch.tensor(widths, dtype=I64)
        self.block_sizes = torch.tensor([size for size, _ in GROUPS], dtype=I32)
        self.reach = torch.tensor([reach for _, reach in GROUPS], dtype=I32)
        self.num_blocks = torch.zeros((len(GROUPS), r), dtype=I32)
        self.slot_mapping_enabled = torch.ones(len(GROUPS), dtype=torch.bool)
        self.dcp_sharded = torch.zeros(len(GROUPS), dtype=torch.bool)
        self.free_blocks = [list(range(1, r * w + 1)) for w in widths]
        self.dirty_rows = 0  # forward-pass rows the last step wrote
        self.max_num_tokens = r * max(self.chunk, k + 1)

    # -- the stub models: functions of a row's token and position, never of the backend ----------
    def target_logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits that favour the draft model's guess, so that drafts are accepted often, not always."""
        logits = self._embedding[tokens.to(I64) % self.vocab].clone()
        logits[torch.arange(tokens.numel()), self.guess(tokens, positions)] += 5.0
        return logits

    def guess(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The token the target model favours after ``tokens`` at ``positions``; the draft model
        guesses it. (The drafter reads each token beside the position before its own, as EAGLE
        pairs a token with the hidden state of the one before: it guesses at position + 1.)"""
        return (tokens.to(I64) * 31 + positions.to(I64) * 7) % self.vocab

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens.to(torch.float32)[:, None] / 7 + torch.arange(self.hidden)).to(torch.bfloat16)

    # -- the host scheduler -----------------------------------------------------------------------
    def _admit_and_retire(self) -> None:
        for i, s in list(self.rows.items()):
            req = self.plan[i]
            if int(self.total_len[s]) - len(req.prompt) >= req.max_tokens:
                del self.rows[i]
                self.finished.append(i)
                for g, table in enumerate(self.block_tables):  # its KV blocks go back to the pool
                    self.free_blocks[g] += table[s, : int(self.num_blocks[g, s])].tolist()
                    self.num_blocks[g, s] = 0
        for i, req in enumerate(self.plan):
            taken = set(self.rows.values())
            if req.arrives == self.steps and i not in self.rows and i not in self.finished:
                free = [s for s in range(self.max_num_reqs) if s not in taken]
                if not free:
                    continue  # no state row: it waits (its arrival is not retried, as a rejection would be)
                s = free[0]
                n = len(req.prompt)
                self.all_token_ids[s].zero_()
                self.all_token_ids[s, :n] = torch.tensor(req.prompt, dtype=I32)
                self.prefill_len[s], self.num_computed[s], self.total_len[s] = n, 0, n
                self.last_sampled[s], self.draft_tokens[s], self.output_bin_counts[s] = 0, 0, 0
                self.seeds[s] = req.seed
                self.rows[i] = s

    def _allocate(self, s: int, tokens: int) -> None:
        """Blocks for the first ``tokens`` positions of state row ``s`` (the KV cache manager's part)."""
        tokens = min(tokens, self.max_model_len)
        for g, (size, _) in enumerate(GROUPS):
            held, need = int(self.num_blocks[g, s]), cdiv(tokens, size)
            for c in range(held, need):
                self.block_tables[g][s, c] = self.free_blocks[g].pop(0)
            self.num_blocks[g, s] = max(held, need)

    def _slot_mappings(self, idx: torch.Tensor, qsl: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Every token's KV slot in each group (K33), padded to max_num_tokens."""
        slots = torch.zeros((len(GROUPS), self.max_num_tokens), dtype=I64)
        launch(self.backend, "_compute_slot_mappings_kernel", (len(GROUPS), idx.numel() + 1), max_num_tokens=self.max_num_tokens,
               idx_mapping=idx, query_start_loc=qsl, pos=positions, block_table_ptrs=self.block_tables,
               block_table_strides=self.block_widths, block_sizes=self.block_sizes,
               slot_mapping_enabled=self.slot_mapping_enabled, dcp_sharded=self.dcp_sharded,
               slot_mappings_ptr=slots, slot_mappings_stride=slots.stride(0), cp_rank=0, CP_SIZE=1, CP_INTERLEAVE=1, PAD_ID=-1,
               TRITON_BLOCK_SIZE=1024)
        return slots

    def step(self) -> dict[str, torch.Tensor]:
        """One step; returns what it computed (the state after it and the step's own outputs)."""
        self._admit_and_retire()
        batch = list(self.rows.values())
        self.steps += 1
        if not batch:
            return self.snapshot({})
        k, be = self.k, self.backend
        query, logits, drafts = [], [], []
        for s in batch:
            left = int(self.prefill_len[s]) - int(self.num_computed[s])
            d = 0 if left > 0 else k  # decoding requests verify the drafts of the step before
            query.append(min(self.chunk, left) if left > 0 else 1 + d)
            drafts.append(d)
            logits.append(1 + d)
        n = len(batch)
        idx = torch.tensor(batch, dtype=I64)
        qsl = torch.tensor([0] + query, dtype=I64).cumsum(0).to(I32)
        cu = torch.tensor([0] + logits, dtype=I64).cumsum(0).to(I32)
        tokens, num_logits = int(qsl[-1]), int(cu[-1])

        # The batch layout.
        if any(drafts):
            expanded, local = torch.zeros(num_logits, dtype=I64), torch.zeros(num_logits, dtype=I32)
            launch(be, "_expand_idx_mapping_kernel", (n,), idx_mapping_ptr=idx, expanded_idx_mapping_ptr=expanded,
                   expanded_local_pos_ptr=local, cu_num_logits_ptr=cu, BLOCK_SIZE=next_power_of_2(k + 1))
        else:
            expanded, local = idx.clone(), torch.zeros(n, dtype=I32)
        input_ids = torch.zeros(tokens, dtype=I32)
        if any(int(self.num_computed[s]) < int(self.prefill_len[s]) for s in batch):
            launch(be, "input_batch._prepare_prefill_inputs_kernel", (n,), input_ids_ptr=input_ids,
                   next_prefill_tokens_ptr=self.next_prefill_tokens, next_prefill_tokens_stride=self.next_prefill_tokens.stride(0),
                   num_lookahead=1, idx_mapping_ptr=idx, query_start_loc_ptr=qsl, all_token_ids_ptr=self.all_token_ids,
                   all_token_ids_stride=self.all_token_ids.stride(0), prefill_lens_ptr=self.prefill_len,
                   num_computed_tokens_ptr=self.num_computed, BLOCK_SIZE=1024, LOOKAHEAD_BLOCK=1)
        positions, seq_lens = torch.zeros(tokens, dtype=I64), torch.zeros(self.max_num_reqs, dtype=I32)
        launch(be, "_prepare_pos_seq_lens_kernel", (n + 1,), pos_ptr=positions, seq_lens_ptr=seq_lens, idx_mapping_ptr=idx,
               query_start_loc_ptr=qsl, num_computed_tokens_ptr=self.num_computed, max_num_reqs=self.max_num_reqs, BLOCK_SIZE=1024)
        logits_indices = torch.zeros(num_logits, dtype=I64)
        launch(be, "_combine_sampled_and_draft_tokens_kernel", (n,), input_ids_ptr=input_ids, idx_mapping_ptr=idx,
               last_sampled_tokens_ptr=self.last_sampled, query_start_loc_ptr=qsl, seq_lens_ptr=seq_lens,
               prefill_len_ptr=self.prefill_len, draft_tokens_ptr=self.draft_tokens, draft_tokens_stride=self.draft_tokens.stride(0),
               cu_num_logits_ptr=cu, logits_indices_ptr=logits_indices, BLOCK_SIZE=next_power_of_2(k + 1), NUM_NEW_SAMPLED_TOKENS=1)

        # KV blocks for this step's tokens and the drafts after them; the forward pass's tables (rows
        # padded to a CUDA-graph size, and over the rows the last step wrote) and slot mappings.
        for s, q in zip(batch, query):
            self._allocate(s, int(self.num_computed[s]) + q + k)
        rows = max(min(next_power_of_2(n), self.max_num_reqs), self.dirty_rows)
        launch(be, "_gather_block_tables_kernel", (len(GROUPS), rows), batch_idx_to_req_idx=idx,
               src_block_table_ptrs=self.block_tables, dst_block_table_ptrs=self.input_block_tables,
               block_table_strides=self.block_widths, num_blocks_ptr=self.num_blocks, num_blocks_stride=self.num_blocks.stride(0),
               num_reqs=n, num_computed_tokens_ptr=self.num_computed, sliding_window_reach_ptr=self.reach,
               block_sizes_ptr=self.block_sizes, MASK_SLIDING_WINDOW=True, BLOCK_SIZE=1024)
        self.dirty_rows = n
        slot_mappings = self._slot_mappings(idx, qsl, positions)

        # The target model, then verification.
        target = self.target_logits(input_ids[logits_indices], positions[logits_indices])
        draft_sampled, pos = torch.zeros(num_logits, dtype=I32), torch.zeros(num_logits, dtype=I64)
        launch(be, "_gather_draft_sampled_kernel", (max(1, -(-num_logits // 1024)),), draft_sampled_ptr=draft_sampled, pos_ptr=pos,
               input_ids_ptr=input_ids, positions_ptr=positions, logits_indices_ptr=logits_indices,
               expanded_idx_mapping_ptr=expanded, expanded_local_pos_ptr=local, prefill_len_ptr=self.prefill_len,
               num_logits=num_logits, BLOCK_SIZE=1024)
        sampled, num_sampled = mrv2_rejection_sample(target, None, draft_sampled, cu, pos, idx, expanded, local,
                                                     self.temperature, self.seeds, k, backend=be)
        num_rejected = torch.zeros(n, dtype=I32)
        launch(be, "_get_num_sampled_and_rejected_kernel", (n,), num_sampled_ptr=num_sampled, num_rejected_ptr=num_rejected,
               seq_lens_ptr=seq_lens, cu_num_logits_ptr=cu, idx_mapping_ptr=idx, prefill_len_ptr=self.prefill_len)
        launch(be, "_post_update_kernel", (n,), idx_mapping_ptr=idx, num_computed_tokens_ptr=self.num_computed,
               last_sampled_tokens_ptr=self.last_sampled, output_bin_counts_ptr=self.output_bin_counts,
               output_bin_counts_stride=self.output_bin_counts.stride(0), sampled_tokens_ptr=sampled,
               sampled_tokens_stride=sampled.stride(0), num_sampled_ptr=num_sampled, num_rejected_ptr=num_rejected,
               query_start_loc_ptr=qsl, all_token_ids_ptr=self.all_token_ids, all_token_ids_stride=self.all_token_ids.stride(0),
               total_len_ptr=self.total_len, draft_tokens_ptr=None, draft_tokens_out_ptr=None, num_draft_tokens=0)

        proposed, draft_slots = self._draft(idx, qsl, input_ids, positions, seq_lens, num_sampled, num_rejected)
        self.draft_tokens[idx] = proposed  # model_runner.py:2326
        return self.snapshot(dict(input_ids=input_ids, positions=positions, seq_lens=seq_lens, logits_indices=logits_indices,
                                  slot_mappings=slot_mappings, draft_slot_mappings=draft_slots,
                                  draft_sampled=draft_sampled, num_sampled=num_sampled, num_rejected=num_rejected,
                                  proposed=proposed))

    def _draft(self, idx: torch.Tensor, qsl: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
               seq_lens: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The EAGLE drafter (speculator.py: propose): its prefill, then k - 1 decode steps, each
        with its slot mappings. Returns the drafts and the decode steps' slot mappings."""
        be, k, n, r = self.backend, self.k, idx.numel(), self.max_num_reqs
        tokens = input_ids.numel()
        last = torch.zeros(r, dtype=I64)
        step = torch.tensor(5, dtype=I64)
        d_ids, d_pos = torch.zeros(tokens, dtype=I32), torch.zeros(tokens, dtype=I64)
        d_qsl, d_lens = torch.zeros(r + 1, dtype=I32), torch.zeros(r, dtype=I32)
        launch(be, "target_dependent_ar._prepare_prefill_inputs_kernel", (n,), last_token_indices_ptr=last,
               draft_current_step_ptr=step, draft_input_ids_ptr=d_ids, draft_positions_ptr=d_pos,
               draft_query_start_loc_ptr=d_qsl, draft_seq_lens_ptr=d_lens, target_input_ids_ptr=input_ids,
               target_positions_ptr=positions, idx_mapping_ptr=idx, last_sampled_ptr=self.last_sampled,
               next_prefill_tokens_ptr=self.next_prefill_tokens, num_sampled_ptr=num_sampled, num_rejected_ptr=num_rejected,
               query_start_loc_ptr=qsl, seq_lens_ptr=seq_lens, max_num_reqs=r, BLOCK_SIZE=1024)
        at = last[:n]
        drafts = torch.zeros((n, k), dtype=I64)
        drafts[:, 0] = self.guess(d_ids[at], d_pos[at] + 1)  # the draft model's first draft
        hidden = torch.zeros((n, self.hidden), dtype=torch.bfloat16)
        d_positions = d_pos[at].clone()
        sample = d_positions + 1
        slots = []
        if k > 1:
            ids = torch.zeros(n, dtype=I32)
            launch(be, "_prepare_decode_inputs_kernel", (n + 1,), draft_tokens_ptr=drafts[:, 0], draft_tokens_stride=drafts.stride(0),
                   target_seq_lens_ptr=seq_lens, num_rejected_ptr=num_rejected, input_ids_ptr=ids, positions_ptr=d_positions,
                   sample_src_positions_ptr=sample, query_start_loc_ptr=d_qsl, seq_lens_ptr=d_lens,
                   max_model_len=self.max_model_len, max_num_reqs=r, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=True)
            for j in range(1, k):
                step.fill_(j)
                slots.append(self._slot_mappings(idx, d_qsl[: n + 1], d_positions))  # where this step's KV goes
                token = self.guess(ids, d_positions + 1)
                launch(be, "_update_draft_inputs_kernel", (n,), output_draft_tokens_ptr=drafts, output_draft_tokens_stride=drafts.stride(0),
                       next_input_hidden_states_ptr=hidden, next_input_hidden_states_stride=hidden.stride(0), input_ids_ptr=ids,
                       positions_ptr=d_positions, sample_src_positions_ptr=sample, seq_lens_ptr=d_lens, draft_tokens_ptr=token,
                       current_draft_step_ptr=step, hidden_states_ptr=self.hidden_states(token),
                       hidden_states_stride=self.hidden, hidden_size=self.hidden, max_model_len=self.max_model_len,
                       num_speculative_steps=k, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=True)
        return drafts, torch.stack(slots) if slots else torch.zeros((0, len(GROUPS), self.max_num_tokens), dtype=I64)

    def snapshot(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = dict(all_token_ids=self.all_token_ids, prefill_len=self.prefill_len, num_computed=self.num_computed,
                     total_len=self.total_len, last_sampled=self.last_sampled, draft_tokens=self.draft_tokens,
                     next_prefill_tokens=self.next_prefill_tokens, output_bin_counts=self.output_bin_counts,
                     **{f"input_block_tables[{g}]": t for g, t in enumerate(self.input_block_tables)})
        return {name: t.clone() for name, t in (state | outputs).items()}
