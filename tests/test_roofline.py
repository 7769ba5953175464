"""The benchmarks' read roofline (csrc/roofline.cpp): it must read every element it is timed on,
or a kernel judged against it would be held to a bandwidth nobody reached."""

from __future__ import annotations

import pytest
import torch

from cpu_impl import _C
from cpu_impl.launcher import buf


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("streams", [1, 2, 9, 16])
def test_every_element_is_read(threads, streams):
    before = _C.max_threads()
    _C.set_num_threads(threads)
    try:
        x = torch.arange(threads * streams * 16 * 40, dtype=torch.float32) % 7
        assert _C.roofline.read_streams(buf(x), streams) == float(x.sum())
    finally:
        _C.set_num_threads(before)


def test_bad_arguments_are_named():
    ones, wide = torch.ones(64), torch.ones(64, dtype=torch.float64)  # alive across the calls: buf() is a raw pointer
    with pytest.raises(ValueError, match="'streams'"):
        _C.roofline.read_streams(buf(ones), 0)
    with pytest.raises(TypeError, match="'x'"):
        _C.roofline.read_streams(buf(wide), 2)
