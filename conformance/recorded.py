"""Launches recorded from a running engine (``SPECDIFF_RECORD``, conformance/vllm_plugin.py), replayed.

A recording is a directory of pairs: ``NNNNNN-<kernel>.safetensors`` holds a launch's arguments as
the engine passed them, ``NNNNNN-<kernel>.out.safetensors`` the same arguments after the engine's
kernel ran. Each launch is judged twice:

- **across backends**, as any saved case (:func:`conformance.runner.run_case`): the contract first
  (a launch it refuses is a finding: either the contract or the engine is wrong, and the line says
  which rule refused it), then every backend against the oracle, bit for bit;
- **against what the engine wrote**: the oracle runs the launch on the engine's own buffers (no
  poison: unwritten cells keep what the engine's buffer held) and every output must equal the
  recorded one, bit for bit. A difference names the output, the first cell and both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.casefile import load_case
from conformance.runner import Diff, Disagreement, bits, copy_args, run_case

OUT_SUFFIX = ".out.safetensors"


@dataclass
class Verdict:
    """One recorded launch: what the backends and the recorded outputs said."""

    path: Path
    kernel: str
    refused: str | None = None  # the contract's refusal, when it refused the launch
    disagreement: str | None = None  # the backends' first disagreement
    recorded: list[str] = field(default_factory=list)  # outputs where the engine's writes differ from the oracle's
    notes: list[Diff] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.refused is None and self.disagreement is None and not self.recorded


def launches(root: Path) -> list[tuple[Path, Path | None]]:
    """Every recorded launch under ``root`` (a directory, searched recursively, or one case file) with
    the file of its outputs when there is one, in recording order."""
    if root.is_file():
        out = root.with_name(root.name.removesuffix(".safetensors") + OUT_SUFFIX)
        return [(root, out if out.is_file() else None)]
    if not root.is_dir():
        raise ValueError(f"replay path {str(root)!r} is neither a case file nor a directory")
    found = []
    for p in sorted(root.rglob("*.safetensors")):
        if p.name.endswith(OUT_SUFFIX):
            continue
        out = p.with_name(p.name.removesuffix(".safetensors") + OUT_SUFFIX)
        found.append((p, out if out.is_file() else None))
    return found


def against_recording(case: Case, after: Case) -> list[str]:
    """Where the oracle, run on the engine's own buffers, writes other bits than the engine did."""
    spec = case.spec
    if after.kernel != case.kernel:
        raise ValueError(f"the outputs file holds a {after.kernel} launch, not {case.kernel}")
    args = copy_args(case.args, "cpu")
    BACKENDS[ORACLE].resolve(spec)(**args)
    diffs = []
    for p in spec.outputs:
        got, want = after.args.get(p.name), args[p.name]
        if not isinstance(want, torch.Tensor):
            continue
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            diffs.append(f"'{p.name}': the outputs file holds no tensor of shape {list(want.shape)} and {want.dtype}")
            continue
        differ = (bits(got) != bits(want)).flatten().nonzero()
        if differ.numel():
            i = int(differ[0])
            diffs.append(f"'{p.name}'[{i}]: the engine wrote {got.flatten()[i].item()!r}, the contract says "
                         f"{want.flatten()[i].item()!r} ({differ.numel()} of {want.numel()} cells differ)")
    return diffs


def judge(path: Path, out: Path | None, backends: list[str]) -> Verdict:
    """One recorded launch through ``backends`` and against its recorded outputs."""
    case = load_case(path)
    verdict = Verdict(path, case.kernel)
    try:
        case.spec.check(case.args)
    except (TypeError, ValueError) as e:
        verdict.refused = str(e)
        return verdict
    try:
        run_case(case, backends, verdict.notes)
    except Disagreement as d:
        verdict.disagreement = str(d)
    if out is not None:
        verdict.recorded = against_recording(case, load_case(out))
    return verdict
