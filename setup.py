"""Builds cpu_impl._C, the OpenMP port in csrc/, with pybind11 (no libtorch linkage).

The build is incremental: each translation unit's object is rebuilt only when the unit or a header it
includes changed (GCC's ``-MMD`` dependency file beside the object; objects of other compile
flags live in a directory of their own), and
the units compile in parallel (``SPECDIFF_BUILD_JOBS``, default every core). An engineer's loop
after editing one ``csrc/`` file:

    python setup.py build_ext --inplace      # one unit compiled, then the link
"""

import hashlib
import os
import shlex
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


def needs_recompile(obj: str, src: str) -> bool:
    """True unless ``obj`` is newer than ``src`` and every header it included."""
    deps = _depends_on(os.path.splitext(obj)[0] + ".d")
    if deps is None:
        return True
    try:
        built = os.stat(obj).st_mtime
        return any(os.stat(d).st_mtime > built for d in [src, *deps])
    except OSError:  # a header that moved or was deleted
        return True


class BuildExt(build_ext):
    """Objects live in a directory named by the compile flags: a sanitizer or ``-march`` build never
    reuses another build's objects, and switching back finds its own still current."""

    def finalize_options(self) -> None:
        super().finalize_options()
        digest = hashlib.sha256(shlex.join(COMPILE).encode()).hexdigest()[:12]
        self.build_temp = os.path.join(self.build_temp, digest)


ParallelCompile("SPECDIFF_BUILD_JOBS", default=0, needs_recompile=needs_recompile).install()

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
