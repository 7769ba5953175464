"""The vLLM plugin (cpu_impl/vllm_plugin.py) against vLLM 0.33.0's own override registry.

vLLM does not import here, so the test builds the part of it the plugin meets: the registry is
``vllm/triton_utils/dispatcher.py`` executed unmodified as ``vllm.triton_utils.dispatcher``; the
kernels' host modules hold vLLM's own Triton kernels (loaded from its files); the platform's hook
registers vLLM's adapters under the mapping read from ``vllm/platforms/cpu.py``. Then, as a worker
does (``worker_base.py``): load the general plugins, call the platform hook, launch.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support import vllm_spec

from conformance import engine
from conformance.backends import BACKENDS
from conformance.engine.cpu import CpuOverrides
from cpu_impl import vllm_plugin
from cpu_impl.launcher import CpuKernel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A stand-in vLLM in sys.modules: the real registry, vLLM's kernels in their host modules,
    a CPU platform whose hook registers vLLM's adapters, and a module that imported a kernel."""
    spec = vllm_spec()
    if spec is None:
        pytest.skip(f"no vLLM: set {engine.ENV} or run `nox -s engine` once (it caches vLLM 0.33.0's sdist)")
    before = engine.named()
    engine.use(spec)
    try:
        overrides: CpuOverrides = engine.overrides()
        loader = engine.loader()
        modules: dict[str, types.ModuleType] = {}

        def module(name: str) -> types.ModuleType:
            if name not in modules:
                modules[name] = types.ModuleType(name)
                monkeypatch.setitem(sys.modules, name, modules[name])
            return modules[name]

        for name in ("vllm", "vllm.triton_utils", "vllm.platforms"):
            module(name)
        dispatcher = overrides.dispatcher  # dispatcher.py as vLLM ships it, its _registry fresh per test
        dispatcher._registry.clear()
        monkeypatch.setitem(sys.modules, "vllm.triton_utils.dispatcher", dispatcher)
        originals = {}
        for qualname in overrides.table:
            path, _, attr = qualname.rpartition(".")
            kernel = loader.kernel(qualname)
            originals[qualname] = kernel
            if path.rpartition(".")[2][:1].isupper():  # a JIT warmup owner: Class.kernel
                mod, _, cls = path.rpartition(".")
                setattr(module(mod), cls, type(cls, (), {attr: kernel}))
            else:
                setattr(module(path), attr, kernel)
        # A module that did `from vllm.v1.sample.rejection_sampler import expand_kernel`.
        holder = module("vllm.v1.worker.holder")
        holder.expand_kernel = originals["vllm.v1.sample.rejection_sampler.expand_kernel"]

        class CpuPlatform:
            registrations = 0

            def is_cpu(self) -> bool:
                return True

            @classmethod
            def register_triton_kernel_overrides(cls) -> None:
                cls.registrations += 1
                dispatcher.register_kernels({q: getattr(overrides.adapters, a) for q, a in overrides.table.items()})

        sys.modules["vllm.platforms"].current_platform = CpuPlatform()
        yield dict(dispatcher=dispatcher, platform=CpuPlatform, originals=originals, holder=holder, modules=modules)
    finally:
        engine.use(before or "")


def _host(vllm: dict[str, Any], qualname: str) -> Any:
    path, _, attr = qualname.rpartition(".")
    mod, _, cls = path.rpartition(".")
    if cls[:1].isupper():
        return getattr(getattr(vllm["modules"][mod], cls), attr)
    return getattr(vllm["modules"][path], attr)


def test_the_plugin_covers_every_spec_decode_kernel_vllms_cpu_platform_overrides(vllm):
    # The platform also overrides kernels outside speculative decoding (mamba_utils' batch memcpy).
    ours = set(vllm_plugin.launchers())
    assert ours <= set(vllm["originals"])
    assert {q for q in vllm["originals"] if ".spec_decode." in q or ".sample." in q or "block_table" in q} == ours


def test_after_the_platform_hook_every_kernel_is_specdiffs(vllm):
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may load a plugin again: one registration still
    platform = type(sys.modules["vllm.platforms"].current_platform)
    platform.register_triton_kernel_overrides()  # what the worker calls next
    assert platform.registrations == 1, "vLLM's own registration must still run, once"
    for qualname, original in vllm["originals"].items():
        kernel = _host(vllm, qualname)
        assert isinstance(kernel, vllm["dispatcher"].KernelOverride), qualname
        ours = qualname in vllm_plugin.launchers()
        assert isinstance(kernel.func, CpuKernel) == ours, f"{qualname}: {kernel.func!r}"  # the rest stay vLLM's
        assert tuple(kernel.arg_names) == tuple(original.arg_names), qualname  # vLLM's launch binding keeps working
    assert isinstance(vllm["holder"].expand_kernel.func, CpuKernel), "a module that imported the kernel is rebound too"


def test_a_launch_through_vllms_names_runs_specdiffs_port(vllm):
    vllm_plugin.register()
    type(sys.modules["vllm.platforms"].current_platform).register_triton_kernel_overrides()
    # vLLM's call sites launch by keyword: expand_kernel[grid](...) of rejection_sampler.py.
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    args = dict(input_ptr=torch.tensor([0.5, 0.0, 2.0]), cu_num_tokens_ptr=cu, replace_from=0, replace_to=1, MAX_NUM_TOKENS=8)
    got = torch.full((5,), -7.0)
    vllm["holder"].expand_kernel[(3,)](output_ptr=got, **args)
    want = torch.full((5,), -7.0)
    BACKENDS["reference"].resolve(vllm_plugin.launchers()["vllm.v1.sample.rejection_sampler.expand_kernel"].spec)(output_ptr=want, **args)
    assert torch.equal(got, want) and torch.equal(got, torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0]))
    # The owner class path of compute_slot_mapping: one request of three tokens, block size 4.
    owner = _host(vllm, "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel")
    slots = torch.full((5,), 99, dtype=torch.int64)
    owner[(2,)](3, 5, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([3, 4, 5]), torch.tensor([[7, 9]], dtype=torch.int32),
                2, slots, 4, 1, 0, 1, -1, 1024)
    assert slots.tolist() == [7 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1, -1, -1]


def test_the_plugin_does_nothing_off_the_cpu(vllm):
    platform = sys.modules["vllm.platforms"].current_platform
    type(platform).is_cpu = lambda self: False
    hook = type(platform).register_triton_kernel_overrides
    vllm_plugin.register()
    assert type(platform).register_triton_kernel_overrides == hook


def test_the_entry_point_is_declared_where_vllm_looks():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]' in text
    assert 'specdiff = "cpu_impl.vllm_plugin:register"' in text
    # Installed (nox installs the tree), vLLM's importlib.metadata lookup finds it.
    found = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "specdiff"]
    if found:
        assert found[0].load() is vllm_plugin.register
