"""Argument types of the command line, shared by every subcommand: names and paths are checked
when the command line is parsed, so that a typo fails in a second with the known names listed,
not after a run of an hour, and not as a traceback."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import tempfile
from collections.abc import Iterator
from pathlib import Path


def unknown(what: str, value: str, known: list[str]) -> str:
    """The message for a name that is not one of ``known``: the closest names when some are close, else all."""
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.8)
    if close:
        return f"unknown {what} {value!r}; did you mean {' or '.join(map(repr, close))}?"
    return f"unknown {what} {value!r}; known: {', '.join(known)}"


def kernel_name(value: str) -> str:
    """A kernel of the contract (``--kernel``)."""
    import contracts

    if value not in contracts.SPECS:
        raise argparse.ArgumentTypeError(unknown("kernel", value, list(contracts.SPECS)))
    return value


def backend_name(value: str) -> str:
    """A registered backend (``--backend``); whether an engine backend has its vLLM is the command's to check."""
    from conformance.backends import BACKENDS

    if value not in BACKENDS:
        raise argparse.ArgumentTypeError(unknown("backend", value, list(BACKENDS)))
    return value


def shard(value: str) -> tuple[int, int]:
    """``K/N`` (``--shard``): the K-th of N shares of a run, one per CI machine, 1 <= K <= N."""
    k, sep, n = value.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"--shard {value!r} must be K/N with 1 <= K <= N, e.g. 2/4")
    return int(k), int(n)


def jobs(value: str) -> int:
    """``--jobs N`` or ``auto`` (every core): processes a command spreads its kernels over."""
    import os

    if value == "auto":
        return os.cpu_count() or 1
    if not (value.isdigit() and int(value) >= 1):
        raise argparse.ArgumentTypeError(f"--jobs {value!r} must be a positive integer or auto")
    return int(value)


def output_file(value: str) -> str:
    """A file the command can write (``--report``, ``--junit``): its directory is created and the file
    opened for append, then what the check created is removed again."""
    path = Path(value)
    try:
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is a directory, not a file")
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
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is not a directory")
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
