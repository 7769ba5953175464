"""CPU launcher of the async-scheduling update over csrc/async_update.cpp."""

from __future__ import annotations

from contracts import async_update as contract
from cpu_impl.launcher import CpuKernel

update_num_computed_tokens_for_batch_change = CpuKernel(contract.UPDATE)
