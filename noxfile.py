"""specdiff's entry points.

    nox -s conformance   the main job: every kernel, three backends, a table and reports/conformance.json
    nox -s tests         the harness's own tests
    nox -s lint          ruff

Every install goes through constraints.txt, which pins torch to the CPU wheel on this
machine's disk: an unpinned torch would pull the registry's CUDA build.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "conformance", "lint"]
nox.options.reuse_venv = "yes"

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints.txt")
PROFILE = os.environ.get("SPECDIFF_PROFILE", "dev")


def install(session: nox.Session, extras: str = "") -> None:
    # torch first, from the pin, so nothing later can resolve it to a CUDA build.
    session.install("torch==2.13.0", *CONSTRAINTS)
    # Editable: the C++ extension is built into cpu_impl/, so `python -m conformance` in the tree finds it.
    session.install("-e", f".[{extras}]" if extras else ".", *CONSTRAINTS)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Three-way conformance of every kernel (profile from SPECDIFF_PROFILE, default dev)."""
    install(session, "test")
    session.run("python", "-m", "conformance", "run", "--profile", PROFILE, *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The harness's own tests: goldens, launch forms, runner power, compositions, statistics."""
    install(session, "test")
    session.run("python", "-m", "pytest", *session.posargs, env={"SPECDIFF_PROFILE": PROFILE})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff", *CONSTRAINTS)
    session.run("ruff", "check", ".")


def _gpu_reason() -> str | None:
    """Why the GPU sessions cannot run here, or None when they can."""
    import shutil

    try:
        import torch
    except ImportError:
        return "torch is not importable in the interpreter running nox"
    if not torch.cuda.is_available():
        return "no CUDA GPU is present"
    if shutil.which("compute-sanitizer") is None:
        return "compute-sanitizer is not on PATH"
    return None


@nox.session(venv_backend="none")
def gpu_sanitize(session: nox.Session) -> None:
    """compute-sanitizer memcheck and initcheck over every Triton kernel on conformance cases.

    Runs in the current interpreter (a GPU machine brings its own CUDA torch and Triton, and the
    extension must already be built there); skips with the reason where no GPU is present.
    """
    reason = _gpu_reason()
    if reason is not None:
        session.skip(f"gpu_sanitize needs a GPU: {reason}")
    for tool in ("memcheck", "initcheck"):
        session.run(
            "compute-sanitizer", "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
            "python", "-m", "conformance", "run", "--profile", PROFILE, "--backend", "triton", "--backend", "triton-split",
            "--report", f"reports/sanitize-{tool}.json", *session.posargs,
        )
