"""The harness catches what it claims to: wrong cells, untouched-cell writes, modified inputs,
and it names the kernel, the odd backend and the request; saved cases replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import contracts
from conformance import casefile, cli, suite
from conformance.arguments import output_file
from conformance.backend import Backend
from conformance.backends import BACKENDS, register_backend
from conformance.case import Case
from conformance.casefile import NOT_SAVED, load_case, replay_command, save_case
from conformance.findings import Findings
from conformance.runner import Diff, Disagreement, run_case


def _case():
    return Case("rejection_greedy_sample_kernel", dict(
        output_token_ids_ptr=torch.full((2, 3), -1, dtype=torch.int32),
        cu_num_draft_tokens_ptr=torch.tensor([2, 3], dtype=torch.int32),
        draft_token_ids_ptr=torch.tensor([1, 2, 3], dtype=torch.int32),
        target_argmax_ptr=torch.tensor([1, 5, 3]),
        bonus_token_ids_ptr=torch.tensor([[7], [8]], dtype=torch.int32),
        is_greedy_ptr=None, max_spec_len=2, uniform_probs_ptr=None, synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False))


def test_the_oracle_memo_runs_a_case_once_and_tells_contents_apart(monkeypatch):
    from conformance import runner

    ran = []
    real = runner.run_backend

    def counted(backend, case, variant=0):
        ran.append(backend.name)
        return real(backend, case, variant)

    monkeypatch.setattr(runner, "run_backend", counted)
    case = _case()
    other = Case(case.spec.name, {**case.args, "target_argmax_ptr": torch.tensor([1, 2, 3])})  # one element differs
    with runner.oracle_memo(case.spec.name):
        first = run_case(case, ["reference", "cpu"])
        again = run_case(case, ["reference", "cpu"])
        run_case(other, ["reference", "cpu"])
    assert ran.count("reference") == 2 and ran.count("cpu") == 3
    assert torch.equal(first["reference"].outputs["output_token_ids_ptr"], again["reference"].outputs["output_token_ids_ptr"])
    run_case(case, ["reference"])  # outside the memo the oracle always runs
    with runner.oracle_memo("expand_kernel"):  # another kernel's memo forgets this one's cases
        pass
    with runner.oracle_memo(case.spec.name):
        run_case(case, ["reference"])
    assert ran.count("reference") == 4


def _faulty(name, fault):
    """A backend that runs the C++ port and then applies ``fault`` to the arguments."""
    cpu = BACKENDS["cpu"]

    class Faulty:
        def __init__(self, spec):
            self.k = cpu.resolve(spec)

        def __getitem__(self, grid):
            def launch(*args, **kw):
                self.k[grid](*args, **kw)
                fault(kw)
            return launch

    return register_backend(Backend(name, lambda spec: Faulty(spec), lambda: "cpu", lambda: "planted"))


@pytest.fixture
def planted():
    made = []
    yield lambda name, fault: made.append(name) or _faulty(name, fault)
    for name in made:
        BACKENDS.pop(name)


def test_agreeing_backends_pass():
    run_case(_case(), ["reference", "triton", "cpu"])


def test_a_wrong_cell_names_kernel_backend_and_request(planted):
    planted("bonus_after_reject", lambda kw: kw["output_token_ids_ptr"].__setitem__((0, 2), 7))
    with pytest.raises(Disagreement) as e:
        run_case(_case(), ["reference", "cpu", "bonus_after_reject"])
    msg = str(e.value)
    assert e.value.backends == ["bonus_after_reject"]
    assert "rejection_greedy_sample_kernel" in msg and "'bonus_after_reject (planted)'" in msg
    assert "flat element 2" in msg and "request 0, draft position 2" in msg


def test_writing_an_untouched_cell_is_caught_even_with_the_callers_value(planted):
    # The kernel must leave cells after a rejection alone; writing the caller's -1 there is still a write.
    planted("writes_placeholder", lambda kw: kw["output_token_ids_ptr"].__setitem__((0, 2), -1))
    with pytest.raises(Disagreement, match="poison"):
        run_case(_case(), ["reference", "cpu", "writes_placeholder"])


def test_modifying_an_input_is_caught(planted):
    planted("scribbler", lambda kw: kw["draft_token_ids_ptr"].add_(1))
    with pytest.raises(Disagreement, match="modified its input 'draft_token_ids_ptr'"):
        run_case(_case(), ["reference", "cpu", "scribbler"])


def test_the_oracle_is_outvoted_by_two_agreeing_backends(monkeypatch):
    case = _case()
    real = BACKENDS["reference"]
    broken = Backend("reference", lambda spec: (lambda **kw: None), real.device, real.mode, gridless=True)
    monkeypatch.setitem(BACKENDS, "reference", broken)
    with pytest.raises(Disagreement) as e:
        run_case(case, ["reference", "triton", "cpu"])
    assert e.value.backends == ["reference"]


def test_saved_cases_replay_from_the_printed_command(tmp_path, planted):
    path = save_case(_case(), tmp_path / "case.safetensors")
    again = load_case(path)
    assert again.kernel == "rejection_greedy_sample_kernel" and torch.equal(again.args["target_argmax_ptr"], torch.tensor([1, 5, 3]))
    cmd = replay_command(path)
    assert cmd.startswith("python -m conformance replay "), cmd  # no machine's interpreter path in a log
    # `python` as the reader's shell finds it: this environment's.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "all backends agree" in done.stdout, done.stdout + done.stderr
    inside = Path("reports") / "failures" / "replay-relative.safetensors"
    assert replay_command(Path.cwd() / inside).endswith(f" {inside}")


def test_aliased_parameters_stay_aliased_and_unpoisoned():
    from conformance.runner import copy_args

    t = torch.arange(3)
    copied = copy_args({"a": t, "b": t, "c": torch.zeros(1)}, "cpu")
    assert copied["a"] is copied["b"] and copied["a"] is not t


def test_every_kernel_has_a_case_strategy():
    from conformance.strategies import cases

    for name in contracts.SPECS:
        assert cases(name) is not None


def test_cli_runs_and_writes_the_report(tmp_path):
    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--profile", "dev", "--kernel", "expand_kernel",
                           "--report", str(report)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    entry = data["kernels"]["expand_kernel"]
    assert {b: e["status"] for b, e in entry.items()} == {"reference": "pass", "triton": "pass", "cpu": "pass"}
    assert entry["cpu"]["examples"] >= 50


@pytest.mark.parametrize("ci", ["", "true"])
def test_profiles_are_the_same_whether_or_not_the_environment_says_ci(ci):
    # Where CI is set, Hypothesis loads its own derandomized profile at import; ours must not inherit
    # it, or `--profile dev --seed N` draws other cases in CI than on a laptop (it hid a planted fault).
    probe = ("from hypothesis import settings; import conformance.profiles as p; "
             "print([(n, settings.get_profile(n).derandomize, settings.get_profile(n).max_examples) for n in p.PROFILES])")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS", "TF_BUILD", "BUILDKITE")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**env, "CI": ci} if ci else env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('dev', False, 50), ('ci', True, 200), ('nightly', False, 2000)]"


# -- the command line checks names and paths before it runs ------------------------------------------
def _usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "threads", "fuzz", "signatures", "sanitize"])
def test_an_unknown_kernel_is_a_usage_error_listing_the_known_ones(command, capsys):
    err = _usage_error([command, "--kernel", "nope"], capsys)
    assert "argument --kernel: unknown kernel 'nope'; known: " in err and "expand_kernel" in err


def test_a_misspelt_name_is_answered_with_the_closest_ones(capsys):
    err = _usage_error(["run", "--kernel", "sample_recovered_token_kernel"], capsys)
    assert "unknown kernel 'sample_recovered_token_kernel'; did you mean 'sample_recovered_tokens_kernel'?" in err, err
    assert "did you mean 'triton'?" in _usage_error(["run", "--backend", "tritn"], capsys)


@pytest.mark.parametrize("command", ["run", "signatures", "mutants"])
def test_an_unknown_backend_is_a_usage_error_listing_the_known_ones(command, capsys):
    err = _usage_error([command, "--backend", "cuda"], capsys)
    assert "argument --backend: unknown backend 'cuda'; known: reference, triton, cpu" in err


def test_a_run_that_could_compare_nothing_is_refused_before_it_starts(capsys, monkeypatch):
    assert "--backend reference alone compares nothing" in _usage_error(["run", "--backend", "reference"], capsys)
    monkeypatch.delenv("SPECDIFF_VLLM", raising=False)
    assert "--backend vllm-cpu: vLLM's own kernels need a vLLM" in _usage_error(["run", "--backend", "vllm-cpu"], capsys)


def test_bad_report_paths_fail_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    for option, value, message in (("--report", tmp_path / "dir", "is a directory"),
                                   ("--report", tmp_path / "file" / "r.json", "cannot write"),
                                   ("--junit", tmp_path / "file" / "sub" / "r.xml", "cannot write")):
        err = _usage_error(["run", "--kernel", "expand_kernel", option, str(value)], capsys)
        assert f"argument {option}: " in err and message in err, err
    assert "argument --reports: " in _usage_error(["sanitize", "--reports", str(tmp_path / "file")], capsys)
    long = str(tmp_path / ("r" * 300 + ".json"))  # past NAME_MAX: the stat itself fails
    err = _usage_error(["run", "--kernel", "expand_kernel", "--report", long], capsys)
    assert "argument --report: cannot write" in err and "File name too long" in err, err
    err = _usage_error(["sanitize", "--reports", str(tmp_path / ("d" * 300))], capsys)
    assert "argument --reports: cannot write into" in err, err


def test_a_bad_profile_in_the_environment_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("SPECDIFF_PROFILE", "bogus")
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err == "error: SPECDIFF_PROFILE='bogus': expected one of dev, ci, nightly\n"


def test_the_report_path_check_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a" / "b" / "r.json"
    assert output_file(str(target)) == str(target)
    assert not (tmp_path / "a").exists()
    (tmp_path / "kept.json").write_text("old")
    output_file(str(tmp_path / "kept.json"))
    assert (tmp_path / "kept.json").read_text() == "old"


@pytest.fixture
def absent():
    """A backend that is registered but cannot run here."""
    cpu = BACKENDS["cpu"]
    register_backend(Backend("absent", cpu.resolve, cpu.device, cpu.mode, lambda: "not on this machine"))
    yield "absent"
    BACKENDS.pop("absent")


def test_a_kernel_only_one_backend_could_run_is_not_compared_and_fails(tmp_path, absent, capsys):
    report = tmp_path / "r.json"
    assert cli.main(["run", "--kernel", "expand_kernel", "--backend", absent, "--report", str(report)]) == 1
    entry = json.loads(report.read_text())["kernels"]["expand_kernel"]
    assert entry["reference"]["status"] == "not compared" and entry[absent]["status"] == "skipped"
    assert "absent: not on this machine" in entry["reference"]["message"]
    assert "FAILED: expand_kernel/reference" in capsys.readouterr().out


def test_the_report_is_written_when_a_step_fails(tmp_path, monkeypatch):
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"

    def check_kernel(name, backends, *args, **kw):
        if name != "expand_kernel":
            raise RuntimeError("the harness broke")
        return {b: {"status": "pass", "examples": 1, "failures": 0, "mode": "-", "seconds": 0, "message": None} for b in backends}

    monkeypatch.setattr(suite, "check_kernel", check_kernel)
    with pytest.raises(RuntimeError, match="the harness broke"):
        cli.main(["run", "--kernel", "expand_kernel", "--kernel", "rejection_greedy_sample_kernel", "--backend", "cpu",
                  "--report", str(report), "--junit", str(junit)])
    data = json.loads(report.read_text())
    assert data["kernels"]["expand_kernel"]["cpu"]["status"] == "pass"
    assert data["incomplete"] == "the run stopped after 1 of 2 kernels: RuntimeError: the harness broke"
    assert 'name="cpu"' in junit.read_text()


def test_an_unwritable_failures_directory_still_reports_the_disagreement(tmp_path, planted, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(casefile, "FAILURES_DIR", tmp_path / "file" / "failures")  # below a file: never creatable
    planted("bonus_after_reject", lambda kw: kw["output_token_ids_ptr"].__setitem__((0, 2), 7))
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--kernel", "rejection_greedy_sample_kernel", "--backend", "cpu", "--backend", "bonus_after_reject",
                   "--no-require-coverage", "--report", str(report)])  # shrinking: a save attempt per smaller failure
    out = capsys.readouterr()
    entry = json.loads(report.read_text())["kernels"]["rejection_greedy_sample_kernel"]
    assert rc == 1 and {b: e["status"] for b, e in entry.items()} == {"reference": "pass", "cpu": "pass", "bonus_after_reject": "fail"}
    assert "'bonus_after_reject (planted)'" in entry["bonus_after_reject"]["message"]
    assert f"replay: {NOT_SAVED}" in entry["bonus_after_reject"]["message"]
    assert out.err.count("warning: could not save the failing rejection_greedy_sample_kernel case") == 1, out.err


def test_findings_keep_their_status_when_their_cases_cannot_be_saved(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(casefile, "FAILURES_DIR", tmp_path / "file" / "failures")
    found = Findings()
    found.add(_case(), Diff("cpu", "output_token_ids_ptr", "value", index=2), "cpu differs")
    found.save({"backends": ["reference", "cpu"]})
    (f,) = found
    assert f.status == "fail" and f.replay == NOT_SAVED


def test_a_malformed_replay_file_is_one_clean_error_line(tmp_path, capsys):
    path = save_case(_case(), tmp_path / "case.safetensors")
    path.write_bytes(path.read_bytes()[:-10])
    assert cli.main(["replay", str(path)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith(f"error: replay file {str(path)!r} is not a saved case") and out.err.count("\n") == 1
    assert "Traceback" not in out.out + out.err
    assert cli.main(["replay", str(tmp_path / "none.safetensors")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_replay_adds_the_oracle_like_run(tmp_path, capsys):
    path = save_case(_case(), tmp_path / "case.safetensors")
    assert cli.main(["replay", str(path), "--backend", "cpu"]) == 0
    assert "on reference (oracle), cpu" in capsys.readouterr().out
    assert cli.main(["replay", str(path), "--backend", "reference"]) == 2
    assert "replay needs two backends to compare, got reference" in capsys.readouterr().err


def test_a_replay_names_a_backend_without_the_kernel_in_one_line(tmp_path, capsys):
    path = save_case(_case(), tmp_path / "case.safetensors")  # triton-split has only K4
    assert cli.main(["replay", str(path), "--backend", "triton-split"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: backend 'triton-split' has no rejection_greedy_sample_kernel: pick among") and err.count("\n") == 1


def test_a_case_file_never_makes_replay_load_code(tmp_path, capsys):
    """A case may name the vLLM it came from; replay loads none because a file says so."""
    from conformance import engine

    evil = tmp_path / "evil"
    marker = tmp_path / "ran"
    (evil / "vllm").mkdir(parents=True)
    (evil / "vllm" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    for module in ("v1/sample/rejection_sampler.py", "utils/cpu_triton_utils.py", "triton_utils/dispatcher.py"):
        (evil / "vllm" / module).parent.mkdir(parents=True, exist_ok=True)
        (evil / "vllm" / module).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    path = save_case(_case(), tmp_path / "case.safetensors", {"vllm": str(evil), "backends": ["reference", "vllm-cpu", "vllm"]})
    before = engine.named()
    assert cli.main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"saved from the engine backends of vLLM {str(evil)!r}; to replay them, pass --vllm" in out
    assert not marker.exists() and engine.named() == before


# -- a backend that kills the process (conformance/isolate.py) --------------------------------------
ROOT = Path(__file__).resolve().parent.parent
CRASHY = '''
import ctypes
from conformance.backend import Backend
from conformance.backends import register_backend
from contracts import SPECS


def _resolve(spec):
    if spec.name != "expand_kernel":
        return None
    from reference.rejection import expand_kernel

    def launch(*args, **kwargs):  # cases launch by keyword or positionally, as the engine may
        a = SPECS["expand_kernel"].bind(args, kwargs)
        if int(a["cu_num_tokens_ptr"].numel()) >= 3:
            ctypes.string_at(0)  # a segfault, as a planted out-of-bounds write would be
        return expand_kernel(**a)

    return launch


register_backend(Backend("crashy", _resolve, lambda: "cpu", lambda: "native", gridless=True))
'''


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_crashing_backend_is_reported_by_name_with_its_case_and_the_run_goes_on(tmp_path, jobs):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(CRASHY)  # every child process registers it too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
           "SPECDIFF_FAILURES": str(tmp_path / "failures")}
    report, junit_xml = tmp_path / "r.json", tmp_path / "r.xml"
    kernels = ["expand_kernel", "rejection_greedy_sample_kernel", "_flatten_sampled_kernel"]
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--profile", "dev", *(a for k in kernels for a in ("--kernel", k)),
                           "--backend", "crashy", "--backend", "cpu", "--jobs", jobs,
                           "--no-require-coverage", "--report", str(report), "--junit", str(junit_xml)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(report.read_text())
    assert sorted(data["kernels"]) == sorted(kernels) and sorted(data["coverage"]) == sorted(kernels[1:])
    for k in kernels:  # each kernel ran in exactly one child, side by side or not
        assert sum(line.startswith(f"  {k}: {{") for line in done.stdout.splitlines()) == (k != "expand_kernel"), done.stdout
    crash = data["kernels"]["expand_kernel"]["crashy"]
    assert crash["status"] == "crash" and "SIGSEGV" in crash["message"], crash
    assert data["kernels"]["rejection_greedy_sample_kernel"]["cpu"]["status"] == "pass"  # the run went on
    saved = tmp_path / "failures" / "expand_kernel.crashy.crash.safetensors"
    assert saved.exists() and str(saved) in crash["message"]
    assert casefile.load_case(saved).args["cu_num_tokens_ptr"].numel() >= 3  # the very case that crashed
    assert "crash" in junit_xml.read_text()
    merged = done.stdout[done.stdout.index("the whole run, every child merged:"):]  # the crashed kernel keeps its row
    row = next(line for line in merged.splitlines() if line.startswith("expand_kernel "))
    assert "crash 0" in row and "FAILED: expand_kernel/crashy (crash)" in merged, merged


def test_a_crash_where_an_out_of_bounds_access_is_listed_is_that_finding(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(CRASHY)
    (tmp_path / "expected.toml").write_text(
        '[[finding]]\nid = "X1-asan"\nkernel = "expand_kernel"\nbackend = "crashy"\noutput = "-"\n'
        'kind = "asan heap-buffer-overflow"\nrule = "heap-buffer-overflow in expand"\ndefect = "reads past the buffer"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
           "SPECDIFF_FAILURES": str(tmp_path / "failures")}
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--profile", "dev", "--kernel", "expand_kernel",
                           "--backend", "crashy", "--backend", "cpu", "--no-require-coverage", "--expected",
                           str(tmp_path / "expected.toml"), "--report", str(tmp_path / "r.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    crash = json.loads((tmp_path / "r.json").read_text())["kernels"]["expand_kernel"]["crashy"]
    assert crash["status"] == "crash" and crash["expected"] == "X1-asan", crash
    assert "expected: X1-asan" in done.stdout and "FAILED" not in done.stdout


UNLOADABLE = '''
import os
import signal
from conformance.backend import Backend
from conformance.backends import register_backend


def _resolve(spec):  # loading the engine's ops: a build this CPU cannot run
    os.kill(os.getpid(), signal.SIGILL)


register_backend(Backend("doomed", _resolve, lambda: "cpu", lambda: "native", engine=True))
'''


def test_a_backend_that_dies_loading_is_one_line_and_the_others_run(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(UNLOADABLE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]), "SPECDIFF_VLLM": "0.33.0",
           "SPECDIFF_FAILURES": str(tmp_path / "failures")}
    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--profile", "dev", "--kernel", "expand_kernel",
                           "--kernel", "rejection_greedy_sample_kernel", "--backend", "doomed", "--backend", "cpu",
                           "--no-require-coverage", "--report", str(report)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "doomed: cannot load: killed the process (SIGILL) while loading, before any case" in done.stdout
    assert "CRASH of" not in done.stdout  # no kernel is blamed
    data = json.loads(report.read_text())
    assert data["unloadable"] == {"doomed": "killed the process (SIGILL) while loading, before any case"}
    assert {k: v["cpu"]["status"] for k, v in data["kernels"].items()} == {"expand_kernel": "pass", "rejection_greedy_sample_kernel": "pass"}
    assert not (tmp_path / "failures").exists()


@pytest.mark.parametrize("kernel", ["sample_recovered_tokens_kernel", "eagle_step_slot_mapping_metadata_kernel",
                                    "copy_and_expand_eagle_inputs_kernel", "_compute_local_logits_stats_kernel"])
def test_show_prints_source_that_rebuilds_the_saved_case_bit_for_bit(kernel, tmp_path):
    """`specdiff show` output, executed, gives back every argument: dtype, shape, strides, offset, the
    same storage where arguments shared one (K5's declared alias), every value's bits (narrow floats
    through their shortest decimal, NaN and infinities), and the oracle's outputs as EXPECTED."""
    from hypothesis import HealthCheck, given, settings

    from conformance.runner import bits, run_backend
    from conformance.strategies import cases
    from conformance.tools import show

    def canonical(t):  # a literal keeps a NaN, not its payload
        return bits(torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t) if t.is_floating_point() else t)

    @settings(max_examples=25, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases(kernel))
    def check(case):
        path = save_case(case, tmp_path / f"{kernel}.safetensors")
        text = show.source(load_case(path))
        scope: dict = {}
        exec(compile(text, "<show>", "exec"), scope)  # noqa: S102 - the tool's own output
        again = scope["case"]
        assert again.kernel == case.kernel and again.grid == case.grid and again.positional == case.positional
        for name, v in case.args.items():
            w = again.args[name]
            if not isinstance(v, torch.Tensor):
                assert w == v or (v != v and w != w), name
                continue
            assert (w.dtype, w.shape, w.stride(), w.storage_offset()) == (v.dtype, v.shape, v.stride(), v.storage_offset()), name
            assert torch.equal(canonical(w), canonical(v)), name
            for other, u in case.args.items():
                if isinstance(u, torch.Tensor) and u.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
                    assert again.args[other].untyped_storage().data_ptr() == w.untyped_storage().data_ptr(), (name, other)
        want = run_backend(BACKENDS["reference"], case)
        if want.error is None:
            assert set(scope["EXPECTED"]) == set(want.outputs)
            assert all(torch.equal(canonical(scope["EXPECTED"][n]), canonical(t)) for n, t in want.outputs.items())

    check()


def test_show_refuses_what_a_literal_cannot_express(tmp_path):
    from conformance.tools import show

    case = _case()
    case.args["target_argmax_ptr"] = torch.tensor([1.0, 5.0, 3.0])._neg_view()
    with pytest.raises(ValueError, match="'target_argmax_ptr' is a negative view"):
        show.source(case)


def test_help_reads_as_plain_text(capsys):
    for argv in (["--help"], *([tool, "--help"] for tool in cli.TOOLS)):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "``" not in out and ":func:" not in out and ":data:" not in out, argv
        if argv[0] != "--help":
            assert len(out.splitlines()) > 8, f"{argv[0]} --help has no description"


def test_a_kernel_shows_a_live_line_on_a_terminal_and_nothing_elsewhere():
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, live in ((Terminal(), True), (io.StringIO(), False)):
        progress = suite.Progress("expand_kernel", ["reference", "cpu"], stream)
        progress.shown -= 1  # past the half-second between updates
        progress.tick(7)
        progress.tick(8)  # within it: not drawn
        progress.close()
        if live:
            assert stream.getvalue().startswith("\r\033[K  expand_kernel on reference, cpu: 7 examples, ")
            assert "8 examples" not in stream.getvalue() and stream.getvalue().endswith("\r\033[K")
        else:
            assert stream.getvalue() == ""


def test_a_backend_without_any_of_the_kernels_has_no_column():
    e = {"status": "pass", "examples": 3, "failures": 0, "mode": "native"}
    text = suite.table({"expand_kernel": {"reference": e, "cpu": e}}, ["reference", "triton-split", "cpu"])
    assert "triton-split" not in text and text.splitlines()[0].split() == ["kernel", "reference", "cpu"]


def test_the_interpreters_ieee_warnings_are_filtered(pytestconfig):
    assert "ignore::RuntimeWarning:triton.runtime.interpreter" in pytestconfig.getini("filterwarnings")
