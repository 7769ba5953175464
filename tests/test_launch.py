"""The CPU launchers accept exactly the launches a Triton kernel accepts (docs/spec.md §1.9, §1.11, C28)."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import contracts
from conformance.backends import BACKENDS

SPECS = list(contracts.SPECS.values())


def _cpu(spec):
    return BACKENDS["cpu"].resolve(spec)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_signatures_match_the_triton_kernel_and_the_oracle(spec):
    names = list(spec.arg_names)
    if spec.host:  # no Triton form (KernelSpec.host)
        assert BACKENDS["triton"].resolve(spec) is None
    else:
        assert list(BACKENDS["triton"].resolve(spec).arg_names) == names + list(spec.tuning)  # tuning: filled by heuristics
    # A kernel that reads its grid (KernelSpec.check_grid): the oracle takes it by keyword only.
    oracle = inspect.signature(BACKENDS["reference"].resolve(spec)).parameters
    assert list(oracle) == names + ["grid"] * (spec.check_grid is not None)
    assert spec.check_grid is None or oracle["grid"].kind is inspect.Parameter.KEYWORD_ONLY
    cpu = _cpu(spec)
    assert list(inspect.signature(cpu).parameters) == names  # vLLM's registry calls it by keyword then
    assert cpu.arg_names == names and cpu.constexprs == list(spec.constexprs)


def _expand_args():
    return dict(output_ptr=torch.zeros(3), input_ptr=torch.tensor([2.0, 0.0]), cu_num_tokens_ptr=torch.tensor([1, 3], dtype=torch.int32),
                replace_from=0, replace_to=1, MAX_NUM_TOKENS=128)


def _launched(call):
    a = _expand_args()
    call(a)
    return a["output_ptr"].tolist()


EXPECTED = [2.0, 1.0, 1.0]


def test_every_launch_form_gives_the_same_result():
    k = _cpu(contracts.get("expand_kernel"))
    order = list(contracts.get("expand_kernel").arg_names)
    assert _launched(lambda a: k[(2,)](**a)) == EXPECTED
    assert _launched(lambda a: k[(2,)](*[a[n] for n in order])) == EXPECTED
    assert _launched(lambda a: k[lambda meta: (2,)](*[a[n] for n in order[:3]], **{n: a[n] for n in order[3:]})) == EXPECTED
    assert _launched(lambda a: k(**a)) == EXPECTED  # a direct call behaves the same
    assert _launched(lambda a: k[(0,)](**a)) == EXPECTED  # the grid is ignored: work comes from the arguments
    assert _launched(lambda a: k[(2,)](**a, num_warps=4, num_stages=2, launch_pdl=False)) == EXPECTED


def test_bad_launches_are_type_errors_naming_the_argument():
    k = _cpu(contracts.get("expand_kernel"))
    a = _expand_args()
    with pytest.raises(TypeError, match="'SYNTHETIC_MODE'"):
        k[(2,)](**a, SYNTHETIC_MODE=False)  # a keyword the kernel does not have
    with pytest.raises(TypeError, match="multiple values for argument 'output_ptr'"):
        k[(2,)](a["output_ptr"], **a)
    del a["MAX_NUM_TOKENS"]
    with pytest.raises(TypeError, match="missing required argument 'MAX_NUM_TOKENS'"):
        k[(2,)](**a)


def test_synthetic_mode_keywords_reach_the_cpu_port():
    """The drift that crashed a CPU port: the GPU call site gained SYNTHETIC_MODE keywords."""
    k = _cpu(contracts.get("rejection_greedy_sample_kernel"))
    out = torch.full((1, 2), -1, dtype=torch.int32)
    k[(1,)](output_token_ids_ptr=out, cu_num_draft_tokens_ptr=torch.tensor([1], dtype=torch.int32),
            draft_token_ids_ptr=torch.tensor([3], dtype=torch.int32), target_argmax_ptr=torch.tensor([0]),
            bonus_token_ids_ptr=torch.tensor([[9]], dtype=torch.int32), is_greedy_ptr=None, max_spec_len=1,
            uniform_probs_ptr=torch.tensor([0.25], dtype=torch.float64),
            synthetic_conditional_rates_ptr=torch.tensor([0.5]), SYNTHETIC_MODE=True)
    assert out.tolist() == [[3, 9]]


def test_outputs_are_written_in_the_callers_buffer_and_dtype():
    """No int64 round trip: an int32 output stays the caller's int32 tensor, written in place."""
    k = _cpu(contracts.get("sample_recovered_tokens_kernel"))
    out = torch.full((2,), -5, dtype=torch.int32)
    ptr = out.data_ptr()
    k[(1, 2)](out, torch.tensor([2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32), None,
              torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.ones(1, 2, dtype=torch.float64), 2, 8192, True, True)
    assert out.dtype == torch.int32 and out.data_ptr() == ptr and out.tolist() == [1, 0]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_vllm_qualnames_point_at_our_modules(spec):
    """Every kernel is found under its family module in each backend, by vLLM's kernel name."""
    for package in ("reference", "cpu_impl") if spec.host else ("reference", "triton_impl", "cpu_impl"):
        module = importlib.import_module(f"{package}.{spec.family}")
        parts = spec.qualname.split(".")
        # The attribute path starts at the kernel or at its owning class (ComputeSlotMappingKernel.kernel).
        first = next(i for i, part in enumerate(parts) if part[0].isupper() or i == len(parts) - 1)
        obj = module
        for part in parts[first:]:
            obj = getattr(obj, part)
        assert obj is not None


def test_the_cpp_launcher_refuses_a_plan_that_does_not_match_its_entry_point():
    """The contract's plan and the C++ entry point's arity are checked against each other when a
    launcher is built, so a parameter added on one side only fails at import, not at a launch."""
    from cpu_impl import _C
    from cpu_impl.launcher import CpuKernel

    spec = contracts.get("expand_kernel")
    plan = [(p.name, False, False, False, {}, True, (0,)) for p in spec.params]
    with pytest.raises(ValueError, match=r"takes 6 arguments, the plan has 5"):
        _C.Launcher("rejection", "expand", plan[:-1], [], torch.Tensor, _C.rejection, None, None)
    with pytest.raises(ValueError, match=r"no C\+\+ entry point rejection.expand_v2"):
        _C.Launcher("rejection", "expand_v2", plan, [], torch.Tensor, _C.rejection, None, None)
    assert CpuKernel(spec)._launcher.run(spec.bind((), _expand_args())) == _C.Launcher.LAUNCHED


def test_a_stand_in_entry_point_gets_the_python_entrys_arguments(monkeypatch):
    """A function put in the submodule in the entry point's place is called instead of the native
    entry, with the Python entry's arguments: (data_ptr, dtype code, numel) per tensor."""
    from cpu_impl import _C

    calls = []
    monkeypatch.setattr(_C.rejection, "expand", lambda *a: calls.append(a))
    a = _expand_args()
    _cpu(contracts.get("expand_kernel"))[(2,)](**a)
    assert a["output_ptr"].tolist() == [0.0, 0.0, 0.0]  # the native entry never ran
    out = a["output_ptr"]
    assert calls == [((out.data_ptr(), 2, 3), (a["input_ptr"].data_ptr(), 2, 2), (a["cu_num_tokens_ptr"].data_ptr(), 0, 2), 0, 1, 128)]
