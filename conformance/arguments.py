"""Argument types of the command line, shared by every subcommand: names and paths are checked
when the command line is parsed, so that a typo fails in a second with the known names listed,
not after a run of an hour, and not as a traceback."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


def kernel_name(value: str) -> str:
    """A kernel of the contract (``--kernel``)."""
    import contracts

    if value not in contracts.SPECS:
        raise argparse.ArgumentTypeError(f"unknown kernel {value!r}; known: {', '.join(contracts.SPECS)}")
    return value


def backend_name(value: str) -> str:
    """A registered backend (``--backend``); whether an engine backend has its vLLM is the command's to check."""
    from conformance.backends import BACKENDS

    if value not in BACKENDS:
        raise argparse.ArgumentTypeError(f"unknown backend {value!r}; known: {', '.join(BACKENDS)}")
    return value


def shard(value: str) -> tuple[int, int]:
    """``K/N`` (``--shard``): the K-th of N shares of a run, one per CI machine, 1 <= K <= N."""
    k, sep, n = value.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"--shard {value!r} must be K/N with 1 <= K <= N, e.g. 2/4")
    return int(k), int(n)


def output_file(value: str) -> str:
    """A file the command can write (``--report``, ``--junit``): its directory is created and the file
    opened for append, then what the check created is removed again."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a directory, not a file")
    try:
        with _created(path.parent):
            existed = path.exists()
            with open(path, "a"):
                pass
            if not existed:
                path.unlink()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {value!r}: {e.strerror or e}") from None
    return value


def output_dir(value: str) -> str:
    """A directory the command can write reports into (``--reports``), checked the same way."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is not a directory")
    try:
        with _created(path), tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write into {value!r}: {e.strerror or e}") from None
    return value


@contextlib.contextmanager
def _created(directory: Path) -> Iterator[None]:
    """``directory`` and its missing parents exist inside the block; those it created are removed after."""
    made: list[Path] = []
    try:
        for d in reversed([d for d in (directory, *directory.parents) if not d.exists()]):
            d.mkdir()
            made.append(d)
        yield
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()


def input_file(value: str) -> str:
    """A file that exists and can be read (``--catalogue``, ``--expected``)."""
    try:
        with open(value, "rb"):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {value!r}: {e.strerror or e}") from None
    return value
