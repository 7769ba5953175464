"""The harness catches what it claims to: wrong cells, untouched-cell writes, modified inputs,
and it names the kernel, the odd backend and the request; saved cases replay."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conformance import kernels
from conformance.backends import BACKENDS, Backend, register_backend
from conformance.runner import Case, Disagreement, load_case, replay_command, run_case, save_case


def _case():
    return Case("rejection_greedy_sample_kernel", dict(
        output_token_ids_ptr=torch.full((2, 3), -1, dtype=torch.int32),
        cu_num_draft_tokens_ptr=torch.tensor([2, 3], dtype=torch.int32),
        draft_token_ids_ptr=torch.tensor([1, 2, 3], dtype=torch.int32),
        target_argmax_ptr=torch.tensor([1, 5, 3]),
        bonus_token_ids_ptr=torch.tensor([[7], [8]], dtype=torch.int32),
        is_greedy_ptr=None, max_spec_len=2, uniform_probs_ptr=None, synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False))


def _faulty(name, fault):
    """A backend that runs the C++ port and then applies ``fault`` to the arguments."""
    cpu = BACKENDS["cpu"]

    class Faulty:
        def __init__(self, spec):
            self.k = cpu.resolve(spec)

        def __getitem__(self, grid):
            def launch(*args, **kw):
                self.k[grid](*args, **kw)
                fault(kw)
            return launch

    return register_backend(Backend(name, lambda spec: Faulty(spec), lambda: "cpu", lambda: "planted"))


@pytest.fixture
def planted():
    made = []
    yield lambda name, fault: made.append(name) or _faulty(name, fault)
    for name in made:
        BACKENDS.pop(name)


def test_agreeing_backends_pass():
    run_case(_case(), ["reference", "triton", "cpu"])


def test_a_wrong_cell_names_kernel_backend_and_request(planted):
    planted("bonus_after_reject", lambda kw: kw["output_token_ids_ptr"].__setitem__((0, 2), 7))
    with pytest.raises(Disagreement) as e:
        run_case(_case(), ["reference", "cpu", "bonus_after_reject"])
    msg = str(e.value)
    assert e.value.backends == ["bonus_after_reject"]
    assert "rejection_greedy_sample_kernel" in msg and "'bonus_after_reject (planted)'" in msg
    assert "flat element 2" in msg and "request 0, draft position 2" in msg


def test_writing_an_untouched_cell_is_caught_even_with_the_callers_value(planted):
    # The kernel must leave cells after a rejection alone; writing the caller's -1 there is still a write.
    planted("writes_placeholder", lambda kw: kw["output_token_ids_ptr"].__setitem__((0, 2), -1))
    with pytest.raises(Disagreement, match="poison"):
        run_case(_case(), ["reference", "cpu", "writes_placeholder"])


def test_modifying_an_input_is_caught(planted):
    planted("scribbler", lambda kw: kw["draft_token_ids_ptr"].add_(1))
    with pytest.raises(Disagreement, match="modified its input 'draft_token_ids_ptr'"):
        run_case(_case(), ["reference", "cpu", "scribbler"])


def test_the_oracle_is_outvoted_by_two_agreeing_backends(monkeypatch):
    case = _case()
    real = BACKENDS["reference"]
    broken = Backend("reference", lambda spec: (lambda **kw: None), real.device, real.mode, gridless=True)
    monkeypatch.setitem(BACKENDS, "reference", broken)
    with pytest.raises(Disagreement) as e:
        run_case(case, ["reference", "triton", "cpu"])
    assert e.value.backends == ["reference"]


def test_saved_cases_replay_from_the_printed_command(tmp_path, planted):
    path = save_case(_case(), tmp_path / "case.pt")
    again = load_case(path)
    assert again.kernel == "rejection_greedy_sample_kernel" and torch.equal(again.args["target_argmax_ptr"], torch.tensor([1, 5, 3]))
    cmd = replay_command(path)
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    assert done.returncode == 0 and "all backends agree" in done.stdout, done.stdout + done.stderr


def test_aliased_parameters_stay_aliased_and_unpoisoned():
    from conformance.runner import _copy_args

    t = torch.arange(3)
    copied = _copy_args({"a": t, "b": t, "c": torch.zeros(1)}, "cpu")
    assert copied["a"] is copied["b"] and copied["a"] is not t


def test_every_kernel_has_a_case_strategy():
    from conformance.strategies import cases

    for name in kernels.SPECS:
        assert cases(name) is not None


def test_cli_runs_and_writes_the_report(tmp_path):
    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--profile", "dev", "--kernel", "expand_kernel",
                           "--report", str(report)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    import json

    data = json.loads(report.read_text())
    entry = data["kernels"]["expand_kernel"]
    assert {b: e["status"] for b, e in entry.items()} == {"reference": "pass", "triton": "pass", "cpu": "pass"}
    assert entry["cpu"]["examples"] >= 50
