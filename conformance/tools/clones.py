"""The C++ port's other instruction-set clones, against the oracle.

The vectorized loops are compiled three times (``SPECDIFF_CLONES`` in ``csrc/common.h``: x86-64-v4,
x86-64-v3 and baseline) and the machine picks one at load time, so a test run only ever exercises
the clone of the machine it runs on. ``python -m conformance clones`` builds the port in a scratch
copy once per other clone, with ``-DSPECDIFF_CLONE=3`` (AVX2 only) or ``-DSPECDIFF_CLONE=1`` (the
baseline, whose fmas are library calls), and runs the conformance suite on it: each clone must give
the oracle's bits, as the clone the machine picks does. Part of ``nox -s nightly`` (two builds of
about 40 s and one conformance pass each).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conformance.arguments import kernel_name
from conformance.profiles import PROFILES, chosen

CLONES = {"v3": "-DSPECDIFF_CLONE=3", "baseline": "-DSPECDIFF_CLONE=1"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("clones", help="build the C++ port's AVX2 and baseline clones alone and check each against the oracle")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--clone", action="append", choices=tuple(CLONES), help="only this clone (repeatable; default: both)")
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    from conformance.tools.mutants import Scratch, source_tree

    kernels = [a for k in ns.kernel or [] for a in ("--kernel", k)]
    failed = []
    for clone in ns.clone or list(CLONES):
        s = Scratch(source_tree("clones"))
        try:
            t = time.perf_counter()
            built = s.build(CLONES[clone])
            if built.returncode != 0:
                print((built.stdout + built.stderr)[-4000:])
                print(f"FAILED: the {clone} clone does not build")
                failed.append(clone)
                continue
            print(f"specdiff clones: {clone} ({CLONES[clone]}) built in {time.perf_counter() - t:.0f} s", flush=True)
            args = ["run", "--profile", ns.profile, "--backend", "reference", "--backend", "cpu", "--no-require-coverage",
                    *kernels, "--report", str(Path(s.dir) / "reports" / "clones.json")]
            done = subprocess.run([sys.executable, "-m", "conformance", *args], cwd=s.dir, env=s.env, capture_output=True, text=True)
            out = (done.stdout + done.stderr).strip()
            print(out[-4000:] if done.returncode else "\n".join(out.splitlines()[-3:]), flush=True)
            print(f"  {clone}: {'agrees with the oracle' if done.returncode == 0 else f'FAILED (exit {done.returncode})'}", flush=True)
            if done.returncode:
                failed.append(clone)
        finally:
            s.close()
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
        return 1
    return 0
