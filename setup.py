"""Builds cpu_impl._C, the OpenMP port in csrc/, with pybind11 (no libtorch linkage)."""

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

ParallelCompile("SPECDIFF_BUILD_JOBS", default=0).install()

setup(
    ext_modules=[
        Pybind11Extension(
            "cpu_impl._C",
            sorted(glob("csrc/*.cpp")),
            include_dirs=["csrc"],
            extra_compile_args=FLAGS + EXTRA,
            extra_link_args=["-fopenmp"] + EXTRA,
            cxx_std=17,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
