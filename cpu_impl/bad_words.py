"""CPU launcher of Model Runner V2's bad words over csrc/bad_words.cpp."""

from __future__ import annotations

from contracts import bad_words as contract
from cpu_impl.launcher import CpuKernel

_bad_words_kernel = CpuKernel(contract.BAD_WORDS)
