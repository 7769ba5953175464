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
