"""Launches recorded from vLLM 0.32.0's CPU speculative decoding (``python -m conformance.e2e --record``),
replayed without vLLM: ``tests/recorded/cpu`` with specdiff's port in the engine, ``tests/recorded/vllm-cpu``
with vLLM's own CPU port. Each is in contract and every backend agrees on it; what the engine wrote is
held against the oracle run on the engine's own buffers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance import cli, recorded
from conformance.casefile import load_case
from conformance.runner import run_case

ROOT = Path(__file__).resolve().parent / "recorded"
LAUNCHES = recorded.launches(ROOT)
# What vLLM's CPU port writes otherwise, launch by launch: its expand_kernel leaves the float
# output unwritten (D1: the temperatures then divide the logits), and its compute_slot_mapping
# leaves the padding tail unwritten (D6).
KNOWN = {"expand_kernel": "output_ptr", "compute_slot_mapping_kernel": "slot_mapping_ptr"}


def test_the_corpus_holds_every_kernel_of_the_cpu_path_from_both_kernel_sets():
    from conformance.vllm_plugin import specs

    # Every kernel of vLLM's CPU path but DFlash's, which neither ngram nor draft_model launches.
    for kernels in ("cpu", "vllm-cpu"):
        held = {load_case(p).kernel for p, _ in recorded.launches(ROOT / kernels)}
        assert held == {s.name for s in specs() if s.family != "dflash"}, kernels
    assert all(out is not None for _, out in LAUNCHES)


@pytest.mark.parametrize(("path", "out"), LAUNCHES, ids=[f"{p.parent.name}/{p.stem}" for p, _ in LAUNCHES])
def test_a_recorded_launch_is_in_contract_and_every_backend_agrees(path, out):
    case = load_case(path)
    case.spec.check(case.args)  # the engine's launch: a refusal here is a contract bug
    run_case(case, ["reference", "triton", "cpu"])


@pytest.mark.parametrize(("path", "out"), LAUNCHES, ids=[f"{p.parent.name}/{p.stem}" for p, _ in LAUNCHES])
def test_what_the_engine_wrote_against_the_contract(path, out):
    case = load_case(path)
    diffs = recorded.against_recording(case, load_case(out))
    if path.parent.name == "cpu" or case.kernel not in KNOWN:
        assert diffs == []
    else:
        assert len(diffs) == 1 and diffs[0].startswith(f"'{KNOWN[case.kernel]}'"), diffs


def test_the_d1_launch_carries_the_temperature_nothing_wrote():
    path = next(p for p, _ in recorded.launches(ROOT / "vllm-cpu") if p.name.endswith("-expand_kernel.safetensors"))
    (diff,) = recorded.against_recording(load_case(path), load_case(recorded.launches(path)[0][1]))
    assert "the engine wrote -12231.328125, the contract says 1.0" in diff


def test_replay_of_a_recording_directory(capsys):
    assert cli.main(["replay", str(ROOT / "cpu"), "--backend", "cpu"]) == 0
    assert "all agree" in capsys.readouterr().out
    assert cli.main(["replay", str(ROOT / "vllm-cpu"), "--backend", "cpu"]) == 1
    lines = capsys.readouterr().out.splitlines()
    wrote = [line for line in lines if line.startswith("ENGINE WROTE OTHERWISE")]
    assert sorted(re.search(r"\d{6}-(\w+)\.safetensors", line).group(1) for line in wrote) == sorted(KNOWN)


def test_an_outputs_file_of_another_kernel_is_refused():
    first = load_case(LAUNCHES[0][0])
    other_out = next(out for path, out in LAUNCHES if load_case(path).kernel != first.kernel)
    with pytest.raises(ValueError, match="holds a"):
        recorded.against_recording(first, load_case(other_out))


def test_an_empty_or_missing_directory_is_one_line(tmp_path, capsys):
    assert cli.main(["replay", str(tmp_path)]) == 2
    assert "holds no recorded launch" in capsys.readouterr().err
