"""The signature gate: every backend's launch signature matches its kernel's contract, and the
gate fails when a call site gains a keyword that a backend lacks."""

from __future__ import annotations

import dataclasses

import pytest

import contracts
from conformance.backend import Backend
from conformance.backends import BACKENDS
from conformance.tools import signatures
from contracts.spec import constexpr

SPECS = list(contracts.SPECS.values())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_backend_matches_the_contract(spec):
    results = signatures.check_all([spec.name])
    failed = [r for r in results if r.ok is False]
    assert not failed, signatures.report(failed)
    every = {"contract", "reference", "triton", "cpu"} if not spec.host else {"contract", "reference", "cpu"}
    assert {r.backend for r in results if r.ok} >= every


def test_contracts_match_vllms_kernels():
    """Names, order and constexprs of every contract against vLLM's own kernel (when one is named)."""
    why = signatures.vllm_unavailable()
    if why is not None:
        pytest.skip(why)
    failed = [r for spec in SPECS for r in signatures.check_vllm(spec) if r.ok is False]
    assert not failed, signatures.report(failed)


def test_a_call_site_that_gains_a_keyword_fails_the_gate():
    """The SYNTHETIC_MODE incident: the engine's call site (the contract) gains a constexpr that
    no backend has yet. Every backend must fail before an engine can call it."""
    spec = contracts.get("expand_kernel")
    grown = dataclasses.replace(spec, params=(*spec.params, constexpr("SYNTHETIC_MODE")))
    for backend in ("reference", "triton", "cpu"):
        names = [r for r in signatures.check_backend(grown, backend) if r.check == "names"]
        assert names and names[0].ok is False and "missing ['SYNTHETIC_MODE']" in names[0].message, (backend, names)


def test_tuning_constexprs_pass_only_where_the_contract_lists_them_and_heuristics_fill_them(monkeypatch):
    """K4's Triton kernel appends SCAN_BLOCK and SCAN_STAGES (KernelSpec.tuning) and fills them
    from the launch's arguments. Without that listing, or with a parameter no heuristic fills, an
    extra parameter is an engine call-site mismatch like any other."""
    import triton
    import triton.language as tl

    spec = contracts.get("sample_recovered_tokens_kernel")
    assert spec.tuning and [r for r in signatures.check_backend(spec, "triton") if r.check == "names"][0].ok
    unlisted = dataclasses.replace(spec, tuning=())
    names = [r for r in signatures.check_backend(unlisted, "triton") if r.check == "names"]
    assert names[0].ok is False and "SCAN_BLOCK" in names[0].message, names

    expand = contracts.get("expand_kernel")
    names_ = ", ".join(expand.arg_names)
    source = f"def k({names_}, EXTRA: tl.constexpr):\n    pass\n"
    scope: dict = {"tl": tl}
    exec(compile(source, "<planted>", "exec"), scope)  # noqa: S102 - a kernel with one unfilled extra
    unfilled = triton.jit(scope["k"])
    monkeypatch.setitem(BACKENDS, "triton-extra", Backend("triton-extra", lambda s: unfilled if s.name == expand.name else None, lambda: "cpu", lambda: "interpreted"))
    listed = dataclasses.replace(expand, tuning=("EXTRA",))
    names = [r for r in signatures.check_backend(listed, "triton-extra") if r.check == "names"]
    assert names[0].ok is False and "without being KernelSpec.tuning filled by triton.heuristics" in names[0].message, names


def test_a_launcher_that_drops_an_argument_fails_cpp_entry(monkeypatch):
    from cpu_impl import _C
    from cpu_impl.launcher import CpuKernel

    spec = contracts.get("expand_kernel")

    def short(*args):  # forgets MAX_NUM_TOKENS, as a port written before the parameter existed would
        _C.rejection.expand(*args[:-1])

    broken = CpuKernel(spec, entry=short)
    monkeypatch.setitem(BACKENDS, "cpu-short", Backend("cpu-short", lambda s: broken if s is spec else None, lambda: "cpu", lambda: "planted"))
    entry = [r for r in signatures.check_backend(spec, "cpu-short") if r.check == "cpp-entry"]
    assert entry and entry[0].ok is False and "passes 5 arguments" in entry[0].message, entry


def test_a_launcher_that_accepts_unknown_keywords_fails(monkeypatch):
    from cpu_impl.launcher import CpuKernel

    spec = contracts.get("expand_kernel")

    class Lenient(CpuKernel):
        def __call__(self, *args, **kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k in spec.arg_names}
            return super().__call__(*args, **kwargs)

    lenient = Lenient(spec)
    monkeypatch.setitem(BACKENDS, "cpu-lenient", Backend("cpu-lenient", lambda s: lenient if s is spec else None, lambda: "cpu", lambda: "planted"))
    unknown = [r for r in signatures.check_backend(spec, "cpu-lenient") if r.check == "unknown-keyword"]
    assert unknown and unknown[0].ok is False and "accepted" in unknown[0].message


def test_the_cli_exits_zero_and_names_the_vllm_skip(capsys):
    from conformance.cli import main

    assert main(["signatures", "--kernel", "expand_kernel", "--vllm"]) == 0
    out = capsys.readouterr().out
    assert "signatures:" in out and " 0 failed" in out
    if signatures.vllm_unavailable() is not None:
        assert "no vLLM named" in out
