"""Builds cpu_impl._C, the OpenMP port in csrc/, with pybind11 (no libtorch linkage).

The build is incremental: each translation unit's object is rebuilt only when the unit or a header it
includes changed (GCC's ``-MMD`` dependency file beside the object; objects of other compile
flags live in a directory of their own), and
the units compile in parallel (``SPECDIFF_BUILD_JOBS``, default every core). An engineer's loop
after editing one ``csrc/`` file:

    python setup.py build_ext --inplace      # one unit compiled, then the link

Objects are also cached by content across builds and environments (each venv, and each isolated
pip build, compiles in a tree of its own): under ``SPECDIFF_CACHE/objects`` (default
``~/.cache/specdiff/objects``), keyed by the unit's bytes, every ``csrc/`` header's, the flags, the
compiler's version, Python's and pybind11's. ``SPECDIFF_BUILD_CACHE=0`` turns it off.
"""

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# Spec §1.8: no fast-math and no contraction, so every product and quotient rounds once.
# -fwrapv: value arithmetic on caller data (a slot from a block id, a count plus one) wraps as
# torch's and Triton's int64 does (C4); size and index arithmetic is checked instead (C32,
# csrc/common.h: checked_mul, checked_add).
FLAGS = ["-O3", "-fopenmp", "-fwrapv", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"]
# SPECDIFF_CXXFLAGS adds flags, e.g. -march=native for benchmarks or sanitizer builds.
EXTRA = shlex.split(os.environ.get("SPECDIFF_CXXFLAGS", ""))
COMPILE = FLAGS + EXTRA + ["-MMD"]  # -MMD: GCC writes <object>.d, the headers the unit included


def _depends_on(depfile: str) -> list[str] | None:
    """The files a make-style dependency file lists after its target, or None if it is unreadable."""
    try:
        with open(depfile, encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return None
    _, sep, deps = text.partition(": ")
    return deps.split() if sep else None


def _stale(obj: str, src: str) -> bool:
    """True unless ``obj`` is newer than ``src`` and every header it included."""
    deps = _depends_on(os.path.splitext(obj)[0] + ".d")
    if deps is None:
        return True
    try:
        built = os.stat(obj).st_mtime
        return any(os.stat(d).st_mtime > built for d in [src, *deps])
    except OSError:  # a header that moved or was deleted
        return True


def _object_cache() -> str | None:
    if os.environ.get("SPECDIFF_BUILD_CACHE") == "0":
        return None
    root = os.environ.get("SPECDIFF_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specdiff")
    return os.path.join(root, "objects")


_TOOLCHAIN: list[str] = []  # the compiler's --version, once the build knows its compiler


def _content_key(src: str) -> str:
    """A unit's object is a function of these: its bytes, every csrc/ header's (a superset of what it
    includes of ours), the flags, the compiler, and the Python and pybind11 headers' versions."""
    import pybind11

    h = hashlib.sha256()
    for part in (shlex.join(COMPILE), *_TOOLCHAIN, sys.version, sysconfig.get_paths()["include"], pybind11.__version__):
        h.update(part.encode() + b"\0")
    for path in [src, *sorted(glob("csrc/*.h"))]:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:32]


def _restore(obj: str, src: str) -> bool:
    """Copies the cached object of ``src``'s content into ``obj``; False when the cache has none."""
    cache = _object_cache()
    cached = os.path.join(cache, _content_key(src) + ".o") if cache and _TOOLCHAIN else None
    if cached is None or not os.path.isfile(cached):
        return False
    os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
    shutil.copyfile(cached, obj)
    with open(os.path.splitext(obj)[0] + ".d", "w", encoding="utf-8") as f:  # what _stale reads next time
        f.write(f"{obj}: {src} {' '.join(sorted(glob('csrc/*.h')))}\n")
    return True


def _store(obj: str, src: str) -> None:
    cache = _object_cache()
    if cache is None or not _TOOLCHAIN or not os.path.isfile(obj):
        return
    try:
        os.makedirs(cache, exist_ok=True)
        tmp = os.path.join(cache, f".{os.getpid()}.{os.path.basename(obj)}")
        shutil.copyfile(obj, tmp)
        os.replace(tmp, os.path.join(cache, _content_key(src) + ".o"))
    except OSError:  # a cache that cannot be written only costs the next build its compile
        pass


class BuildExt(build_ext):
    """Objects live in a directory named by the compile flags: a sanitizer or ``-march`` build never
    reuses another build's objects, and switching back finds its own still current."""

    def finalize_options(self) -> None:
        super().finalize_options()
        digest = hashlib.sha256(shlex.join(COMPILE).encode()).hexdigest()[:12]
        self.build_temp = os.path.join(self.build_temp, digest)

    def build_extensions(self) -> None:
        try:
            _TOOLCHAIN[:] = [subprocess.run([self.compiler.compiler_so[0], "--version"], capture_output=True, text=True,
                                            check=True).stdout]
        except (OSError, subprocess.CalledProcessError, AttributeError, IndexError):
            _TOOLCHAIN[:] = []  # an unknown compiler: no cache
        compile_one = self.compiler._compile

        def _compile(obj, src, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not _restore(obj, src):
                compile_one(obj, src, *args, **kwargs)
                _store(obj, src)

        self.compiler._compile = _compile
        super().build_extensions()


ParallelCompile("SPECDIFF_BUILD_JOBS", default=0, needs_recompile=_stale).install()

setup(
    ext_modules=[
        Pybind11Extension(
            "cpu_impl._C",
            sorted(glob("csrc/*.cpp")),
            include_dirs=["csrc"],
            # A changed header makes setuptools revisit the extension; needs_recompile then picks
            # the units that include it.
            depends=sorted(glob("csrc/*.h")),
            extra_compile_args=COMPILE,
            extra_link_args=["-fopenmp"] + EXTRA,
            cxx_std=17,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
