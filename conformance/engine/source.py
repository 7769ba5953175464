"""Where an engine's files come from, without installing or importing the engine.

``--vllm`` names either a release (``0.33.0``: its source distribution is fetched from the package
index once, its digest checked, and unpacked into the cache) or a path: a wheel, an unpacked wheel,
a source distribution or a source tree. A source distribution holds both halves the engine
backends need, the Python package (Triton kernels, the CPU overrides, the dispatcher) and
``csrc/cpu`` (the C++ port); a wheel holds only the Python half, so ``vllm-cpu`` needs a source
tree or a release.

``--sglang`` works the same way for SGLang (:data:`SGLANG`), whose releases the index holds as
wheels only: a release is one pinned wheel of that version (the Python sources are the same in
every platform's), and only the modules of its speculative and sampling kernels are unpacked.
What differs between the engines is data, a :class:`Distribution`; the machinery is one.

Archives are untrusted input: only regular files under the engine's own directories (``vllm/`` and
``csrc/``; SGLang's kernel modules) are unpacked, with tarfile's ``data`` filter (no links, devices,
absolute paths or ``..``), and a fetched archive is used only when its SHA-256 matches the index's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

INDEX = os.environ.get("SPECDIFF_INDEX_URL", "https://pypi.org/simple")
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z0-9.+-]*)$")


class SourceError(ValueError):
    """``--vllm`` (``--sglang``) names nothing usable; the message says what was expected."""


@dataclass(frozen=True)
class Distribution:
    """One engine's files as the package index and its archives hold them: data, one per engine."""

    package: str  # the root package, and the project's name on the index
    title: str  # as messages name the engine
    option: str  # the command-line option naming a release or a path
    # Top directories of the tree an archive's members are kept under (a member's path from there).
    roots: tuple[str, ...]
    suffixes: tuple[str, ...]
    # The file of a release to fetch, among the index's (or the cache's) file names; None: none fits.
    pick: Callable[[str, Sequence[str]], str | None]
    # A further filter on a kept member's path inside the tree (``sglang/kernels/ops/...``).
    keep: Callable[[PurePosixPath], bool] = lambda rel: True

    def wanted(self, name: str) -> str | None:
        """The path inside the tree of an archive member we keep, else None."""
        parts = PurePosixPath(name).parts
        for i, part in enumerate(parts[:3]):
            # An sdist nests the tree under NAME-X.Y.Z/ (a checkout of SGLang's, under python/ too);
            # no deeper, so that tests/vllm/x.py never lands on vllm/x.py.
            if i == 2 and parts[1] != "python":
                break
            if part in self.roots:
                rel = PurePosixPath(*parts[i:])
                return str(rel) if rel.suffix in self.suffixes and self.keep(rel) else None
        return None


def _sdist(version: str, names: Sequence[str]) -> str | None:
    name = f"vllm-{version}.tar.gz"
    return name if name in names else None


VLLM = Distribution("vllm", "vLLM", "--vllm", ("vllm", "csrc"), (".py", ".cpp", ".hpp", ".h"), _sdist)


def _sglang_wheel(version: str, names: Sequence[str]) -> str | None:
    """The pinned wheel of an SGLang release: CPython 3.11's manylinux x86_64 where the index has it,
    else the first by name. SGLang publishes no sdist; its wheels are platform-tagged for their
    compiled extras only, and the Python sources kept here are the same in each."""
    wheels = sorted(n for n in names if n.endswith(".whl") and n.split("-")[:2] == ["sglang", version])
    preferred = [n for n in wheels if "-cp311-cp311-manylinux" in n and n.endswith("_x86_64.whl")]
    return (preferred or wheels or [None])[0]


# SGLang's Triton kernels of speculative verification and sampling, and the package files on their path.
SGLANG_KERNELS = ("kernels/ops/speculative", "kernels/ops/sampling")
SGLANG_PACKAGE_FILES = ("__init__.py", "_version.py", "kernels/__init__.py", "kernels/ops/__init__.py")


def _sglang_member(rel: PurePosixPath) -> bool:
    inner = rel.relative_to("sglang").as_posix()
    return inner in SGLANG_PACKAGE_FILES or any(inner.startswith(d + "/") for d in SGLANG_KERNELS)


SGLANG = Distribution("sglang", "SGLang", "--sglang", ("sglang",), (".py",), _sglang_wheel, _sglang_member)


@dataclass(frozen=True)
class Source:
    """An unpacked engine: ``root / package`` is the Python package; ``csrc`` (vLLM's C++) is None
    for a wheel, and always for SGLang, whose C++ CPU ops are not in its wheel."""

    root: Path
    csrc: Path | None
    label: str
    package: str = "vllm"

    @property
    def release(self) -> str | None:
        """The release this tree says it is (``<package>/_version.py``, written at build), or None."""
        path = self.root / self.package / "_version.py"
        try:
            found = re.search(r"^__version__ = version = ['\"]([^'\"]+)['\"]", path.read_text(), re.M)
        except OSError:
            return None
        return found.group(1) if found else None

    def module_file(self, module: str) -> Path | None:
        """The source file of a dotted module name (``vllm.v1.sample.rejection_sampler``)."""
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None


VllmSource = Source  # the name vLLM's tools and tests use


def cache_dir() -> Path:
    """Downloads and builds: ``SPECDIFF_CACHE``, else ``~/.cache/specdiff`` (CI points it into the clone)."""
    return Path(os.environ.get("SPECDIFF_CACHE") or Path.home() / ".cache" / "specdiff")


def locate(spec: str, dist: Distribution = VLLM) -> Source:
    """The engine named by ``spec``: a release version, or a path (wheel, sdist, unpacked tree)."""
    if not spec:
        raise SourceError(f"{dist.option} must name a release (e.g. {REFERENCE[dist.package]}) or a path to a wheel, sdist or source tree")
    path = Path(spec).expanduser()
    if path.exists():
        return _from_path(path.resolve(), dist)
    if _VERSION.match(spec):
        return _from_path(fetch_release(spec, dist), dist)
    raise SourceError(f"{dist.option} {spec!r} is neither an existing path nor a release version such as {REFERENCE[dist.package]}")


# The release each engine's contracts are written against (the example in messages).
REFERENCE = {"vllm": "0.33.0", "sglang": "0.5.23"}


def _from_path(path: Path, dist: Distribution = VLLM) -> Source:
    if path.is_dir():
        pkg = dist.package
        if not (path / pkg / "__init__.py").is_file() and (path / "python" / pkg / "__init__.py").is_file():
            path = path / "python"  # SGLang's checkout keeps its package under python/
        if (path / pkg / "__init__.py").is_file():
            csrc = path / "csrc" if dist is VLLM and (path / "csrc" / "cpu").is_dir() else None
            what = "source tree" if csrc else "Python sources, no csrc/cpu" if dist is VLLM else "Python sources"
            return Source(path, csrc, f"{path} ({what})", pkg)
        raise SourceError(f"{dist.option} {str(path)!r}: a directory must hold {pkg}/__init__.py (a source tree or an unpacked wheel)")
    if path.suffix == ".whl":
        return _from_path(_unpack(path, "wheel", dist), dist)
    if path.name.endswith((".tar.gz", ".tgz")):
        return _from_path(_unpack(path, "sdist", dist), dist)
    raise SourceError(f"{dist.option} {str(path)!r}: expected a .whl, a .tar.gz source distribution or a directory")


def _wanted(name: str) -> str | None:
    """vLLM's filter (:meth:`Distribution.wanted`): Python sources and csrc."""
    return VLLM.wanted(name)


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Holds ``name``'s lock in the cache while one process makes what the others would wait for
    (a download, an unpacked source, a build): the children of a ``--jobs`` run share one cache."""
    import fcntl

    with open(_mkdir(cache_dir()) / f".{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# An archive is untrusted: what unpacking it may write. vLLM 0.33.0's sdist keeps 3,137 files, 53 MB,
# none above 1 MB; the cache keeps the unpacked sources used last, up to UNPACKED_BYTES.
MEMBER_BYTES, TOTAL_BYTES, MEMBERS = 16 << 20, 512 << 20, 50_000
UNPACKED_BYTES = 1 << 30


def _unpack(archive: Path, kind: str, dist: Distribution = VLLM) -> Path:
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    dest = cache_dir() / dist.package / f"{archive.name}-{digest}"
    if (dest / ".complete").is_file():
        os.utime(dest)  # used now: the last to be evicted
        return dest
    with cache_lock(dest.name):
        if not (dest / ".complete").is_file():  # another process may have unpacked it while this one waited
            _unpack_into(archive, kind, dest, dist)
    _evict(dest.parent, UNPACKED_BYTES, keep=dest)
    return dest


def _evict(root: Path, bound: int, keep: Path) -> None:
    """Removes the least recently used unpacked sources under ``root`` until they fit in ``bound`` bytes."""
    entries = []
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith(".") and (d / ".complete").is_file():
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            entries.append((d.stat().st_mtime, size, d))
    total = sum(size for _, size, _ in entries)
    for _, size, d in sorted(entries):
        if total <= bound:
            break
        if d != keep:
            shutil.rmtree(d, ignore_errors=True)
            total -= size


def _escapes(name: str) -> bool:
    parts = Path(name).parts
    return Path(name).is_absolute() or ".." in parts


def _unpack_into(archive: Path, kind: str, dest: Path, dist: Distribution = VLLM) -> None:
    what = "wheel" if kind == "wheel" else "source distribution"
    opt, title = dist.option, dist.title
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=_mkdir(dest.parent)))
    total = kept = 0

    def admit(name: str, size: int) -> None:
        nonlocal total, kept
        if size > MEMBER_BYTES:
            raise SourceError(f"{opt} {str(archive)!r}: member {name!r} holds {size} bytes, more than {MEMBER_BYTES} "
                              f"(no source file of {title} comes near): refused")
        total, kept = total + size, kept + 1
        if total > TOTAL_BYTES or kept > MEMBERS:
            raise SourceError(f"{opt} {str(archive)!r}: more than {TOTAL_BYTES} bytes or {MEMBERS} files of sources: refused")

    try:
        if kind == "wheel":
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if _escapes(info.filename):
                        raise SourceError(f"{opt} {str(archive)!r}: member {info.filename!r} escapes the archive: refused")
                    rel = dist.wanted(info.filename)
                    if rel is None or info.is_dir():
                        continue
                    admit(info.filename, info.file_size)
                    target = tmp / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(info))  # zipfile reads no more than the size admitted
        else:
            with tarfile.open(archive) as t:
                members = []
                for m in t.getmembers():
                    if _escapes(m.name):
                        raise SourceError(f"{opt} {str(archive)!r}: member {m.name!r} escapes the archive: refused")
                    rel = dist.wanted(m.name)
                    if rel is not None and m.isfile():
                        admit(m.name, m.size)
                        m.name = rel
                        members.append(m)
                t.extractall(tmp, members=members, filter="data")
        (tmp / ".complete").write_text(archive.name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        first = (str(e).strip().splitlines() or [""])[0].rstrip(":")
        raise SourceError(f"{opt} {str(archive)!r}: not a readable {what} ({type(e).__name__}: {first})") from None
    except OSError as e:
        raise SourceError(f"{opt} {str(archive)!r}: could not unpack it under {dest.parent} ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mkdir(p: Path) -> Path:
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SourceError(f"cannot write the cache directory {str(p)!r} ({e.strerror or e}): point SPECDIFF_CACHE "
                          "at a directory you can write") from None
    return p


def fetch_sdist(version: str) -> Path:
    """vLLM's source distribution for ``version`` from the package index (cached, digest-checked)."""
    return fetch_release(version, VLLM)


def fetch_release(version: str, dist: Distribution = VLLM) -> Path:
    """The archive of ``dist``'s release ``version`` from the package index (``Distribution.pick``:
    vLLM's sdist, SGLang's pinned wheel), cached in ``downloads/`` and digest-checked when fetched.
    A cached archive is used without asking the index: the same pick among the cache's files."""
    downloads = _mkdir(cache_dir() / "downloads")
    cached = dist.pick(version, [p.name for p in downloads.iterdir() if p.is_file()])
    if cached is not None:
        return downloads / cached
    with cache_lock(f"{dist.package}-{version}"):
        cached = dist.pick(version, [p.name for p in downloads.iterdir() if p.is_file()])
        return downloads / cached if cached is not None else _download(version, dist, downloads)


def _download(version: str, dist: Distribution, downloads: Path) -> Path:
    opt = dist.option
    request = urllib.request.Request(f"{INDEX}/{dist.package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            files = json.load(r)["files"]
        name = dist.pick(version, [f["filename"] for f in files])
        entry = next((f for f in files if f["filename"] == name), None)
        url, want = (entry["url"], entry["hashes"]["sha256"]) if entry is not None else (None, None)
    except OSError as e:
        raise SourceError(f"{opt} {version}: the package index could not be read ({e}); pass a path instead") from None
    except (ValueError, KeyError, TypeError) as e:  # the index's answer is data from elsewhere: one line
        raise SourceError(f"{opt} {version}: the package index answered with no usable file list ({type(e).__name__}: {e})") from None
    if url is None or name is None:
        what = f"{dist.package}-{version}.tar.gz" if dist is VLLM else f"wheel of {dist.package} {version}"
        raise SourceError(f"{opt} {version}: the package index has no {what}")
    target = downloads / name
    part = target.with_suffix(".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=300) as r, part.open("wb") as out:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise SourceError(f"{opt} {version}: downloading {name} failed ({e}); pass a path instead") from None
    if h.hexdigest() != want:
        part.unlink()
        raise SourceError(f"{opt} {version}: {name} does not match the index's SHA-256 (got {h.hexdigest()}, want {want})")
    part.rename(target)
    return target
