"""Conformance as pytest tests: one test per kernel x backend, read from the contracts.

``tests/test_conformance.py`` parametrizes :func:`params` and calls :func:`check`; this plugin
(``pytest_plugins`` in ``tests/conftest.py``) gathers what each test recorded and, at the end of the
run, prints the kernel x backend table and writes the conformance report (``reports/conformance.json``
unless ``--conformance-report`` says otherwise; the CLI's schema). So pytest's own tools apply:

    pytest tests/test_conformance.py -k sample_recovered      # one kernel, every backend
    pytest tests/test_conformance.py -n auto                   # spread over every core (pytest-xdist)
    pytest tests/test_conformance.py -x --lf --junitxml=...    # stop early, rerun failures, JUnit

A test runs the kernel's Hypothesis cases through the oracle and its backend, bit for bit: every
backend equal to the oracle is every backend equal to every other. Which one is wrong when the oracle
is (every backend's test of the kernel fails alike) is the CLI's three-way vote to say
(``python -m conformance run``). Under the ``ci`` and ``nightly`` profiles a required state class that
no case reached fails the test too. Reports travel from xdist's workers with the test reports
(``user_properties``), so the table is whole whichever worker ran what.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

import contracts
from conformance import suite
from conformance.arguments import shard
from conformance.backends import ORACLE
from conformance.case import Case
from conformance.profiles import INTERPRETED_EXAMPLES, chosen
from conformance.runner import oracle_memo

PROPERTY = "specdiff-conformance"


def params(backends: Sequence[str]) -> list[Any]:
    """``pytest.param(kernel, backend)`` for every contract and every backend in ``backends`` (the
    oracle aside) that runs it here; a backend that is unavailable, or lacks a kernel it should have,
    is a skipped or failing test that says so."""
    out = []
    for name in contracts.SPECS:
        runnable, skipped = suite.available(name, [ORACLE, *backends], set())
        for b in backends:
            if b == ORACLE:
                continue
            status = "pass" if b in runnable else skipped.get(b, {}).get("status")
            if status in ("pass", "missing"):  # a missing kernel runs, and fails saying so
                # A kernel's tests share a worker (--dist loadgroup), and so the oracle's outcomes.
                out.append(pytest.param(name, b, id=f"{name}-{b}", marks=pytest.mark.xdist_group(name)))
            elif status == "skipped":
                out.append(pytest.param(name, b, id=f"{name}-{b}", marks=pytest.mark.skip(reason=skipped[b]["message"])))
    return out


def check(kernel: str, backend: str, examples: Sequence[Case] = ()) -> dict[str, Any]:
    """The kernel's cases through the oracle and ``backend``: the per-backend report entries and the
    kernel's coverage, as the CLI's report holds them."""
    runnable, skipped = suite.available(kernel, [ORACLE, backend], {backend})
    if backend not in runnable:
        return {"kernel": kernel, "backends": skipped, "coverage": None}
    seen: Counter[str] = Counter()
    with oracle_memo(kernel):  # the kernel's other backends' tests (one xdist group) ran the same cases
        per = suite.check_kernel(kernel, [ORACLE, backend], None, seen, examples=examples, interpreted=INTERPRETED_EXAMPLES.get(chosen()))
    complete = all(e["status"] == "pass" for e in per.values())
    return {"kernel": kernel, "backends": per, "coverage": suite.state_coverage(kernel, seen, complete)}


def verdict(result: dict[str, Any]) -> str | None:
    """Why the test fails, or None."""
    for b, e in result["backends"].items():
        if e["status"] != "pass":
            return f"{result['kernel']} x {b}: {e['status']}\n{e.get('message') or ''}"
    missing = (result["coverage"] or {}).get("missing")
    if missing and chosen() in ("ci", "nightly"):
        return f"{result['kernel']}: required state classes never generated: {', '.join(missing)}"
    return None


# -- the plugin ------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--conformance-report", default="reports/conformance.json",
                     help="where tests/test_conformance.py's run writes its report (the CLI's schema)")
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N shares of the conformance tests (1 <= K <= N): one share per CI machine")


def _shard(text: str) -> tuple[int, int]:
    try:
        return shard(text)
    except argparse.ArgumentTypeError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--shard K/N keeps every N-th conformance test from the K-th (collection order is the contracts'
    order, the same on every machine), deselecting the rest; other tests are untouched."""
    if config.getoption("--shard") is None:
        return
    k, n = _shard(config.getoption("--shard"))
    ours = [i for i in items if i.originalname == "test_conformance" and i.module.__name__.endswith("test_conformance")]
    drop = {id(i) for j, i in enumerate(ours) if j % n != k - 1}
    config.hook.pytest_deselected(items=[i for i in items if id(i) in drop])
    items[:] = [i for i in items if id(i) not in drop]


class _Gather:
    def __init__(self, path: str) -> None:
        self.path = path
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.results += [json.loads(v) for k, v in report.user_properties if k == PROPERTY]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results:
            return
        table: dict[str, dict[str, dict[str, Any]]] = {}
        coverage: dict[str, Any] = {}
        for r in sorted(self.results, key=lambda r: list(contracts.SPECS).index(r["kernel"])):
            table.setdefault(r["kernel"], {}).update(r["backends"])
            if r["coverage"] is not None:
                coverage[r["kernel"]] = r["coverage"]
        backends = [ORACLE, *dict.fromkeys(b for r in self.results for b in r["backends"] if b != ORACLE)]
        terminalreporter.write_sep("=", "conformance (kernel x backend)")
        terminalreporter.write_line(suite.table(table, backends))
        report = {**suite.report_head(chosen(), None), "kernels": table, "coverage": coverage, "source": "pytest"}
        path = suite.write_report(self.path, report)
        terminalreporter.write_line(f"conformance report: {path}")


def pytest_configure(config: pytest.Config) -> None:
    # numpy's RuntimeWarnings from inside Triton's interpreter are IEEE arithmetic doing what the
    # kernels ask (a divide by zero to inf, an overflow to inf, an inf - inf to NaN): the outputs are
    # compared bit for bit, and the warnings, dozens a run, say nothing a test can act on.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
    config.pluginmanager.register(_Gather(config.getoption("--conformance-report")), "specdiff-conformance-gather")
