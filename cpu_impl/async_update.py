"""CPU launcher of the async-scheduling update over csrc/async_update.cpp."""

from __future__ import annotations

from conformance.kernels import async_update as contracts
from cpu_impl.launcher import CpuKernel

update_num_computed_tokens_for_batch_change = CpuKernel(contracts.UPDATE)
