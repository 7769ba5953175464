"""Where vLLM's files come from, without installing or importing vLLM.

``--vllm`` names either a release (``0.33.0``: its source distribution is fetched from the package
index once, its digest checked, and unpacked into the cache) or a path: a wheel, an unpacked wheel,
a source distribution or a source tree. A source distribution holds both halves the engine
backends need, the Python package (Triton kernels, the CPU overrides, the dispatcher) and
``csrc/cpu`` (the C++ port); a wheel holds only the Python half, so ``vllm-cpu`` needs a source
tree or a release.

Archives are untrusted input: only regular files under ``vllm/`` and ``csrc/`` are unpacked, with
tarfile's ``data`` filter (no links, devices, absolute paths or ``..``), and a fetched archive is
used only when its SHA-256 matches the index's.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INDEX = os.environ.get("SPECDIFF_INDEX_URL", "https://pypi.org/simple")
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z0-9.+-]*)$")


class SourceError(ValueError):
    """``--vllm`` names nothing usable; the message says what was expected."""


@dataclass(frozen=True)
class VllmSource:
    """An unpacked vLLM: ``root / "vllm"`` is the Python package; ``csrc`` is None for a wheel."""

    root: Path
    csrc: Path | None
    label: str

    @property
    def release(self) -> str | None:
        """The release this tree says it is (``vllm/_version.py``, written at build), or None."""
        path = self.root / "vllm" / "_version.py"
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


def cache_dir() -> Path:
    """Downloads and builds: ``SPECDIFF_CACHE``, else ``~/.cache/specdiff`` (CI points it into the clone)."""
    return Path(os.environ.get("SPECDIFF_CACHE") or Path.home() / ".cache" / "specdiff")


def locate(spec: str) -> VllmSource:
    """The vLLM named by ``spec``: a release version, or a path (wheel, sdist, unpacked tree)."""
    if not spec:
        raise SourceError("--vllm must name a release (e.g. 0.33.0) or a path to a wheel, sdist or source tree")
    path = Path(spec).expanduser()
    if path.exists():
        return _from_path(path.resolve())
    if _VERSION.match(spec):
        return _from_path(fetch_sdist(spec))
    raise SourceError(f"--vllm {spec!r} is neither an existing path nor a release version such as 0.33.0")


def _from_path(path: Path) -> VllmSource:
    if path.is_dir():
        if (path / "vllm" / "__init__.py").is_file():
            csrc = path / "csrc" if (path / "csrc" / "cpu").is_dir() else None
            return VllmSource(path, csrc, f"{path} ({'source tree' if csrc else 'Python sources, no csrc/cpu'})")
        raise SourceError(f"--vllm {str(path)!r}: a directory must hold vllm/__init__.py (a source tree or an unpacked wheel)")
    if path.suffix == ".whl":
        return _from_path(_unpack(path, "wheel"))
    if path.name.endswith((".tar.gz", ".tgz")):
        return _from_path(_unpack(path, "sdist"))
    raise SourceError(f"--vllm {str(path)!r}: expected a .whl, a .tar.gz source distribution or a directory")


def _wanted(name: str) -> str | None:
    """The path inside the tree of an archive member we keep (Python sources and csrc), else None."""
    parts = Path(name).parts
    for i, part in enumerate(parts[:2]):  # an sdist nests everything under vllm-X.Y.Z/
        if part in ("vllm", "csrc"):
            rel = Path(*parts[i:])
            if rel.suffix in (".py", ".cpp", ".hpp", ".h"):
                return str(rel)
            return None
    return None


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


def _unpack(archive: Path, kind: str) -> Path:
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    dest = cache_dir() / "vllm" / f"{archive.name}-{digest}"
    if (dest / ".complete").is_file():
        os.utime(dest)  # used now: the last to be evicted
        return dest
    with cache_lock(dest.name):
        if not (dest / ".complete").is_file():  # another process may have unpacked it while this one waited
            _unpack_into(archive, kind, dest)
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


def _unpack_into(archive: Path, kind: str, dest: Path) -> None:
    what = "wheel" if kind == "wheel" else "source distribution"
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=_mkdir(dest.parent)))
    total = kept = 0

    def admit(name: str, size: int) -> None:
        nonlocal total, kept
        if size > MEMBER_BYTES:
            raise SourceError(f"--vllm {str(archive)!r}: member {name!r} holds {size} bytes, more than {MEMBER_BYTES} "
                              "(no source file of vLLM comes near): refused")
        total, kept = total + size, kept + 1
        if total > TOTAL_BYTES or kept > MEMBERS:
            raise SourceError(f"--vllm {str(archive)!r}: more than {TOTAL_BYTES} bytes or {MEMBERS} files of sources: refused")

    try:
        if kind == "wheel":
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if _escapes(info.filename):
                        raise SourceError(f"--vllm {str(archive)!r}: member {info.filename!r} escapes the archive: refused")
                    rel = _wanted(info.filename)
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
                        raise SourceError(f"--vllm {str(archive)!r}: member {m.name!r} escapes the archive: refused")
                    rel = _wanted(m.name)
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
        raise SourceError(f"--vllm {str(archive)!r}: not a readable {what} ({type(e).__name__}: {first})") from None
    except OSError as e:
        raise SourceError(f"--vllm {str(archive)!r}: could not unpack it under {dest.parent} ({e.strerror or e})") from None
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
    name = f"vllm-{version}.tar.gz"
    target = _mkdir(cache_dir() / "downloads") / name
    if target.is_file():
        return target
    with cache_lock(name):
        return target if target.is_file() else _download(version, name, target)


def _download(version: str, name: str, target: Path) -> Path:
    request = urllib.request.Request(f"{INDEX}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == name), None)
        url, want = (entry["url"], entry["hashes"]["sha256"]) if entry is not None else (None, None)
    except OSError as e:
        raise SourceError(f"--vllm {version}: the package index could not be read ({e}); pass a path instead") from None
    except (ValueError, KeyError, TypeError) as e:  # the index's answer is data from elsewhere: one line
        raise SourceError(f"--vllm {version}: the package index answered with no usable file list ({type(e).__name__}: {e})") from None
    if url is None:
        raise SourceError(f"--vllm {version}: the package index has no {name}")
    part = target.with_suffix(".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=300) as r, part.open("wb") as out:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise SourceError(f"--vllm {version}: downloading {name} failed ({e}); pass a path instead") from None
    if h.hexdigest() != want:
        part.unlink()
        raise SourceError(f"--vllm {version}: {name} does not match the index's SHA-256 (got {h.hexdigest()}, want {want})")
    part.rename(target)
    return target
