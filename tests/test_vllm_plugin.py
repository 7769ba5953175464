"""The vLLM plugin (conformance/vllm_plugin.py) against vLLM 0.33.0's own override registry.

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

from conformance import engine, vllm_plugin
from conformance.backends import BACKENDS
from conformance.casefile import load_case
from conformance.engine.cpu import CpuOverrides
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
        assert _ported(kernel.func) == ours, f"{qualname}: {kernel.func!r}"  # the rest stay vLLM's
        assert tuple(kernel.arg_names) == tuple(original.arg_names), qualname  # vLLM's launch binding keeps working
    assert _ported(vllm["holder"].expand_kernel.func), "a module that imported the kernel is rebound too"


def _ported(func: Any) -> bool:
    return isinstance(func, vllm_plugin.Launcher) and isinstance(func.kernel, CpuKernel)


def _hooked() -> None:
    vllm_plugin.register()
    type(sys.modules["vllm.platforms"].current_platform).register_triton_kernel_overrides()


def _draft_step(vllm: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One draft step as vLLM's drafter launches it (llm_base_proposer.py, 0.32.0 and 0.33.0): positions
    and out_clamped_positions two slices of one buffer, keyword launch through the host module."""
    k5 = _host(vllm, "vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel")
    positions = torch.zeros(16, dtype=torch.int64)
    positions[:3] = torch.tensor([5, 8, 99])
    table = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32)
    seq_lens = torch.tensor([6, 9, 100], dtype=torch.int32)
    slots = torch.full((4,), 7, dtype=torch.int64)
    k5[(4,)](positions_ptr=positions[:3], block_table_ptr=table, block_table_stride=2, seq_lens_ptr=seq_lens,
             out_clamped_positions_ptr=positions[:3], out_slot_mapping_ptr=slots, block_size=4, max_model_len=100,
             n_blocks_per_req=2, PAD_ID=-1, batch_size=3)
    return {"positions": positions, "seq_lens": seq_lens, "slots": slots}


@pytest.mark.parametrize("kernels", ["cpu", "reference"])
def test_the_draft_step_vllm_launches_runs_on_every_kernel_set(vllm, monkeypatch, kernels):
    # The launch that killed draft_model speculative decoding at its first draft step: the contract
    # refused two slice objects of one buffer (C31 now asks for the same elements, not one object).
    monkeypatch.setenv("SPECDIFF_PLUGIN_KERNELS", kernels)
    _hooked()
    got = _draft_step(vllm)
    assert got["positions"][:4].tolist() == [6, 9, 0, 0]
    assert got["slots"].tolist() == [2 * 4 + 2, 4 * 4 + 1, -1, -1]
    assert got["seq_lens"].tolist() == [7, 10, 1]
    assert vllm_plugin.LAUNCHES["eagle_step_slot_mapping_metadata_kernel"] >= 1


def test_the_engine_set_keeps_vllms_kernels_and_records_their_launches(vllm, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDIFF_PLUGIN_KERNELS", "engine")
    monkeypatch.setenv("SPECDIFF_RECORD", str(tmp_path))
    monkeypatch.setenv("SPECDIFF_RECORD_LIMIT", "1")
    _hooked()
    k5 = "vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel"
    func = _host(vllm, k5).func
    assert isinstance(func, vllm_plugin.Launcher) and func.kernel is vllm["dispatcher"]._registry[k5][1].kernels["engine"]
    assert not isinstance(func.kernel, CpuKernel)
    first = _draft_step(vllm)
    _draft_step(vllm)  # past the limit: run, not saved
    saved = sorted((tmp_path / "vllm-cpu").glob("*.safetensors"))
    assert [p.name for p in saved] == ["000001-eagle_step_slot_mapping_metadata_kernel.out.safetensors",
                                       "000001-eagle_step_slot_mapping_metadata_kernel.safetensors"]
    before, after = load_case(saved[1]), load_case(saved[0])
    # The alias survives the file: one tensor for both, holding the positions before the launch.
    assert before.args["positions_ptr"] is before.args["out_clamped_positions_ptr"]
    assert before.args["positions_ptr"].tolist() == [5, 8, 99]
    assert after.args["positions_ptr"].tolist() == first["positions"][:3].tolist()
    assert after.args["out_slot_mapping_ptr"].tolist() == first["slots"].tolist()
    assert before.meta["recorded"]["kernels"] == "vllm-cpu"


def test_an_unwritable_recording_directory_is_a_warning(vllm, monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDIFF_RECORD", str(blocker / "cases"))  # below a file: cannot be made
    _hooked()
    assert _draft_step(vllm)["slots"].tolist()[2:] == [-1, -1]
    assert "not recording" in capsys.readouterr().err


def test_a_full_disk_stops_recording_with_one_warning(vllm, monkeypatch, tmp_path, capsys):
    import conformance.casefile

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(conformance.casefile, "save_case", full)
    monkeypatch.setenv("SPECDIFF_RECORD", str(tmp_path))
    _hooked()
    for _ in range(3):  # every launch still runs, and computes
        assert _draft_step(vllm)["slots"].tolist() == [2 * 4 + 2, 4 * 4 + 1, -1, -1]
    assert capsys.readouterr().err.count("recording stopped") == 1


def test_kernel_sets_switch_at_run_time(vllm, monkeypatch):
    # One engine process interleaves the sets (python -m conformance.e2e): each launch goes to the active one.
    _hooked()
    k5 = _host(vllm, "vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel").func
    results = {}
    for kernels in ("engine", "reference", "cpu"):
        vllm_plugin.use(kernels)
        assert (k5.kernel is k5.kernels[kernels]) and isinstance(k5.kernel, CpuKernel) == (kernels == "cpu")
        results[kernels] = {k: v.tolist() for k, v in _draft_step(vllm).items()}
    assert results["engine"] == results["reference"] == results["cpu"]
    with pytest.raises(ValueError, match="kernels must be one of"):
        vllm_plugin.use("gpu")


def test_a_bad_kernel_set_is_refused_naming_the_variable(vllm, monkeypatch):
    monkeypatch.setenv("SPECDIFF_PLUGIN_KERNELS", "gpu")
    with pytest.raises(ValueError, match="SPECDIFF_PLUGIN_KERNELS"):
        vllm_plugin.register()


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
    assert 'specdiff = "conformance.vllm_plugin:register"' in text
    # Installed (nox installs the tree), vLLM's importlib.metadata lookup finds it.
    found = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "specdiff"]
    if found:
        assert found[0].load() is vllm_plugin.register
