"""The one shared test utility: launch a kernel on a named backend, as the engine would."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from hypothesis import settings

import contracts
from compositions.sampler import launch
from conformance import engine
from conformance.backends import BACKENDS as REGISTERED
from conformance.case import Case
from conformance.engine.source import cache_dir
from conformance.profiles import chosen
from conformance.tools.fuzz import launch_grid
from contracts.spec import Table


def vllm_spec() -> str | None:
    """The vLLM the engine tests use: SPECDIFF_VLLM, else 0.33.0 when its sdist is already cached
    (`nox -s engine` leaves it there; CI runs that session first), else None."""
    spec = os.environ.get(engine.ENV)
    if spec:
        return spec
    return "0.33.0" if (cache_dir() / "downloads" / "vllm-0.33.0.tar.gz").is_file() else None


def _engine_backends() -> tuple[str, ...]:
    """vLLM's own Triton kernels join the golden tests when a vLLM is at hand. (Its CPU port does
    not: its known defects, conformance/engine/expected.toml, fail goldens by design.)"""
    spec = vllm_spec()
    if spec is None:
        return ()
    engine.use(spec)
    return ("vllm",) if REGISTERED["vllm"].unavailable() is None else ()


BACKENDS = ("reference", "triton", "cpu", *_engine_backends())

# Interpreted Triton at an engine's widths (8,192-column tiles, split top-p over whole rows) takes
# minutes a test on two cores. `nox -s tests` runs these checks on the oracle and the C++ port and
# leaves Triton's share to `nox -s nightly` (pytest marker `nightly`); compiled Triton runs them on
# a GPU in seconds.
TRITON_NIGHTLY = pytest.param("triton", marks=pytest.mark.nightly)


def composed(test: Any) -> Any:
    """A test that runs whole compositions (several kernels, every backend, interpreted Triton: seconds
    an example): 25 examples under ci, 200 under nightly (`nox -s nightly` runs the tests marked
    `composed`). Each kernel inside is checked at full depth by `nox -s conformance`."""
    return pytest.mark.composed(settings(max_examples={"dev": 10, "ci": 25}.get(chosen(), 200))(test))


def run(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> dict[str, Any]:
    """Launches and returns the arguments (outputs written in place)."""
    launch(backend, kernel, grid, **args)
    return args


def refused(backend: str, kernel: str, args: dict[str, Any], error: type[Exception], *names: str) -> None:
    """The launch raises ``error`` naming every one of ``names``, and changes no tensor."""
    every = {f"{k}[{g}]": t for k, v in args.items() if isinstance(v, Table) for g, t in enumerate(v)}
    every |= {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in every.items() if v.layout is torch.strided and v.untyped_storage().data_ptr()}
    # A kernel that reads its grid gets the canonical one, as the fuzz launches: the refusal is the argument's.
    grid = launch_grid(contracts.get(kernel), Case(kernel, args), args)
    with pytest.raises(error) as e:
        run(backend, kernel, grid, **args)
    for n in names:
        assert f"'{n}'" in str(e.value), str(e.value)
    for k, v in before.items():
        same = torch.equal(every[k], v) or (v.dtype.is_floating_point and torch.allclose(every[k], v, rtol=0, atol=0, equal_nan=True))
        assert same, f"{k} changed on a refused launch"


def i32(x: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def i64(x: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64)


def f32(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def f64(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)
