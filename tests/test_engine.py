"""The engine backends: vLLM's own kernels and CPU port, loaded from its files, reported by name.

These need vLLM 0.33.0's files: ``SPECDIFF_VLLM`` (a release or a path), or its source distribution
already in the cache (``nox -s engine`` fetches it; CI runs that session first). Without either
they skip, saying so. The loader's own parts (archives, shim generation, expected findings) are
tested on files made here.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from found_cases import ENGINE
from support import vllm_spec

import contracts
from conformance import engine, findings
from conformance.backends import BACKENDS
from conformance.case import Case
from conformance.casefile import save_case
from conformance.engine import cpu, source
from conformance.runner import Disagreement, run_case

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def vllm() -> Iterator[source.VllmSource]:
    spec = vllm_spec()
    if spec is None:
        pytest.skip(f"no vLLM: set {engine.ENV} or run `nox -s engine` once (it caches vLLM 0.33.0's sdist)")
    before = engine.named()
    engine.use(spec)
    yield engine.located()
    engine.use(before or "")


def _tree(vllm: source.VllmSource, dest: Path, files: list[str]) -> Path:
    """A source tree holding copies of ``files`` (relative to vLLM's root) and vllm/__init__.py."""
    for rel in [*files, "vllm/__init__.py"]:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        src = vllm.root / rel if (vllm.root / rel).exists() else vllm.csrc.parent / rel  # type: ignore[union-attr]
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            shutil.copy(src, target)
    return dest


def _plant(path: Path, find: str, replace: str) -> None:
    text = path.read_text()
    assert text.count(find) == 1, f"{find!r} must occur once in {path}"
    path.write_text(text.replace(find, replace))


# -- loading ------------------------------------------------------------------------------------------
def test_every_contract_resolves_to_a_vllm_kernel_with_its_parameter_names(vllm):
    import contracts
    from conformance.backend import engine_of

    for spec in contracts.SPECS.values():
        if spec.op or engine_of(spec) != "vllm":  # a C++ op of the CPU build (its schema is checked below); SGLang's
            continue
        kernel = engine.loader().kernel(spec.qualname)
        assert kernel is not None, spec.qualname
        names = list(inspect.signature(kernel).parameters) if spec.host else list(kernel.arg_names)
        assert names == list(spec.arg_names), spec.name


def test_every_op_contract_names_a_vllm_op_with_its_inputs(vllm):
    import contracts
    from conformance.tools.signatures import check_op

    ops = [s for s in contracts.SPECS.values() if s.op]
    assert {s.op for s in ops} == {"greedy_argmax", "fused_gumbel_argmax"}
    for spec in ops:
        assert check_op(spec).ok, check_op(spec).message


def test_the_cpu_overrides_are_read_from_the_engines_registration(vllm):
    table = cpu.registered(vllm)
    import contracts

    # vLLM 0.33.0 ports the ten V1 kernels to C++, and nothing of Model Runner V2 (its rejection
    # sampler, batch state, drafter, sampling parameters, logits processors and logprobs), FLy, the async update or
    # top-k/top-p (on a CPU without Triton it sorts in PyTorch instead: docs/topk_topp.md).
    unported = ("mrv2", "input_batch", "target_dependent_ar", "block_table", "fly", "async_update", "topk_topp", "sample",
                "penalties", "bad_words", "logit_bias", "logprob")
    # The CPU sampler ops (argmax) are ops of the CPU build, no kernel's override.
    from conformance.backend import engine_of

    v1 = {s.qualname for s in contracts.SPECS.values() if s.family not in unported and not s.op and engine_of(s) == "vllm"}
    assert len(v1) == 10 and v1 <= set(table)
    assert not {s.qualname for f in unported for s in contracts.FAMILIES[f]} & set(table)
    assert table["vllm.v1.sample.rejection_sampler.expand_kernel"] == "_expand_kernel_impl"


def test_a_planted_fault_in_vllms_triton_kernel_is_reported_against_vllm(vllm, tmp_path):
    tree = _tree(vllm, tmp_path / "vllm-planted", ["vllm/v1/sample/rejection_sampler.py"])
    # The replacement test turned around: values, never addresses, change (an interpreted kernel
    # that stored out of bounds would corrupt this process).
    _plant(tree / "vllm/v1/sample/rejection_sampler.py", "tl.where(src_val == replace_from, replace_to, src_val)",
           "tl.where(src_val == replace_to, replace_from, src_val)")
    before = engine.named()
    engine.use(str(tree))
    try:
        from conformance.suite import check_kernel

        found = findings.Findings()
        check_kernel("expand_kernel", ["reference", "cpu", "vllm"], seed=1, findings=found)
    finally:
        engine.use(before or "")
    assert any(f.backend == "vllm" and f.status == "fail" and f.kind == "value" for f in found), [f.headline() for f in found]
    assert not any(f.backend in ("reference", "cpu") for f in found)


def test_a_planted_fault_in_vllms_cpp_is_reported_against_vllm_cpu(vllm, tmp_path):
    files = ["vllm/v1/sample/rejection_sampler.py", "vllm/utils/cpu_triton_utils.py", "vllm/triton_utils/dispatcher.py",
             "vllm/platforms/cpu.py", "csrc/cpu"]
    tree = _tree(vllm, tmp_path / "vllm-planted", files)
    _plant(tree / "csrc/cpu/spec_decode_utils.cpp", "if (draft_ids_ptr[start_idx + pos] != target_id) {",
           "if (draft_ids_ptr[start_idx + pos] == target_id) {")
    report = tmp_path / "engine.json"
    # One process per build of torch.ops._C (a library namespace registers once per process).
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "run", "--vllm", str(tree), "--backend", "reference", "--backend", "vllm-cpu",
         "--kernel", "rejection_greedy_sample_kernel", "--profile", "dev", "--seed", "1", "--call-site", "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "SPECDIFF_FAILURES": str(tmp_path / "failures")},
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(report.read_text())["findings"]
    assert any(f["backend"] == "vllm-cpu" and f["status"] == "fail" and f["expected"] is None for f in got), got
    assert "new finding: rejection_greedy_sample_kernel x vllm-cpu" in done.stdout


def _as_0_30(tree: Path) -> None:
    """K10 with vLLM 0.30.0's parameters, planted in a copy of 0.33.0's: an attention block size and
    the blocks per KV block beside KV_CACHE_BLOCK_SIZE, used as 0.30.0's kernel uses them; its CPU
    adapter takes them too and passes the C++ the attention block size."""
    k10 = tree / "vllm/v1/worker/block_table.py"
    _plant(k10, "block_table_stride,  # max_num_blocks_per_req", "block_table_stride,\n        block_size,")
    _plant(k10, "KV_CACHE_BLOCK_SIZE: tl.constexpr,", "KV_CACHE_BLOCK_SIZE: tl.constexpr,\n        BLOCKS_PER_KV_BLOCK: tl.constexpr,")
    _plant(k10, "block_table_ptr + row_offset + virtual_block_indices,",
           "block_table_ptr + row_offset + virtual_block_indices * BLOCKS_PER_KV_BLOCK + local_block_offsets // block_size,")
    _plant(k10, "slot_ids = block_numbers * KV_CACHE_BLOCK_SIZE + local_block_offsets",
           "slot_ids = block_numbers * block_size + local_block_offsets % block_size")
    adapter = tree / "vllm/utils/cpu_triton_utils.py"
    _plant(adapter, "    block_table_stride: int,  # max_num_blocks_per_req\n    slot_mapping: torch.Tensor,  # [max_num_tokens], int64\n"
           "    KV_CACHE_BLOCK_SIZE: int,\n",
           "    block_table_stride: int,\n    block_size: int,\n    slot_mapping: torch.Tensor,\n    KV_CACHE_BLOCK_SIZE: int,\n"
           "    BLOCKS_PER_KV_BLOCK: int,\n")
    _plant(adapter, "        slot_mapping,\n        KV_CACHE_BLOCK_SIZE,\n    )", "        slot_mapping,\n        block_size,\n    )")


@pytest.mark.parametrize("backend", ["vllm", "vllm-cpu"])
def test_an_earlier_release_runs_bound_as_its_call_site_binds_it(vllm, tmp_path, monkeypatch, backend):
    import dataclasses

    from conformance.suite import check_kernel

    spec = contracts.get("compute_slot_mapping_kernel")
    files = ["vllm/v1/worker/block_table.py", "vllm/utils/cpu_triton_utils.py", "vllm/triton_utils/dispatcher.py",
             "vllm/platforms/cpu.py", "csrc/cpu"]
    _as_0_30(_tree(vllm, tmp_path / "vllm-0.30", files))
    before = engine.named()
    engine.use(str(tmp_path / "vllm-0.30"))
    try:
        assert isinstance(BACKENDS[backend].resolve(spec), engine.Bound)  # the kernel (or adapter) of 0.30.0's form
        found = findings.Findings()
        check_kernel(spec.name, ["reference", backend], seed=1, findings=found, call_site=True)
        # Bound, it is judged like 0.33.0's: no drift; on the CPU port, D6 as in 0.33.0.
        findings.mark_expected(found, findings.expected())
        assert not [f for f in found if f.kind == "signature"], [f.headline() for f in found]
        assert {f.expected for f in found if f.status == "fail"} <= {"D6"}, [f.headline() for f in found]
        # Where 0.30.0 computes otherwise (C22 past a block, a rule it predates), the cases are named so.
        assert engine.LATER_RULE.name in {f.rule for f in found if f.status == "unsupported"}, [f.headline() for f in found]
        # Its outputs are judged: a wrong binding (twice the block size) is a value failure.
        (earlier,) = spec.earlier
        wrong = dataclasses.replace(earlier, bind=lambda a: {**earlier.bind(a), "block_size": 2 * a["KV_CACHE_BLOCK_SIZE"]})
        monkeypatch.setattr(spec, "earlier", (wrong,))
        engine.use(str(tmp_path / "vllm-0.30"))
        found = findings.Findings()
        check_kernel(spec.name, ["reference", backend], seed=1, findings=found, call_site=True)
        assert any(f.status == "fail" and f.kind == "value" and f.backend == backend for f in found), [f.headline() for f in found]
    finally:
        engine.use(before or "")


def test_a_refusal_inside_a_declared_capability_is_unsupported_not_a_failure(vllm):
    from conformance.strategies.rejection import prefilled_output  # the caller's -1 prefilled output

    a = dict(
        output_token_ids_ptr=prefilled_output(1, 1, torch.int32),
        cu_num_draft_tokens_ptr=torch.tensor([1], dtype=torch.int32),
        draft_token_ids_ptr=torch.tensor([3], dtype=torch.int32),
        target_argmax_ptr=torch.tensor([3], dtype=torch.int64),
        bonus_token_ids_ptr=torch.tensor([[5]], dtype=torch.int32),
        is_greedy_ptr=None,
        max_spec_len=1,
        uniform_probs_ptr=torch.tensor([0.25], dtype=torch.float64),
        synthetic_conditional_rates_ptr=torch.tensor([0.5], dtype=torch.float32),
        SYNTHETIC_MODE=True,
    )
    notes: list = []
    outcomes = run_case(Case("rejection_greedy_sample_kernel", a), ["reference", "cpu", "vllm-cpu"], notes)
    assert outcomes["vllm-cpu"].error.startswith("AssertionError")
    assert [(n.backend, n.kind, n.rule) for n in notes] == [("vllm-cpu", "unsupported", "synthetic mode")]


@pytest.mark.parametrize("case, backend, output, kind", ENGINE, ids=[f"{c.kernel}-{k}" for c, _, _, k in ENGINE])
def test_frozen_engine_defects_still_show(vllm, case, backend, output, kind):
    """The engine's defects as runs first found them (tests/found_cases.py): the engine's backend
    still differs there, alone, in the same way. When vLLM fixes one, this fails: drop its entry."""
    with pytest.raises(Disagreement) as e:
        run_case(case, ["reference", "cpu", backend])
    assert {(d.backend, d.output, d.kind) for d in e.value.diffs} == {(backend, output, kind)}, str(e.value)


# -- the parts that need no vLLM ------------------------------------------------------------------------
def test_an_archive_keeps_only_sources_and_refuses_links(tmp_path):
    member = tmp_path / "payload.py"
    member.write_text("x = 1\n")
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(member, "vllm-9.9.9/vllm/__init__.py")
        t.add(member, "vllm-9.9.9/csrc/cpu/x.cpp")
        t.add(member, "vllm-9.9.9/setup.py")
        link = tarfile.TarInfo("vllm-9.9.9/vllm/evil.py")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
    os.environ["SPECDIFF_CACHE"], old = str(tmp_path / "cache"), os.environ.get("SPECDIFF_CACHE")
    try:
        src = source.locate(str(archive))
    finally:
        if old is None:
            del os.environ["SPECDIFF_CACHE"]
        else:
            os.environ["SPECDIFF_CACHE"] = old
    assert (src.root / "vllm/__init__.py").is_file() and src.csrc is not None
    assert not (src.root / "setup.py").exists() and not (src.root / "vllm/evil.py").exists()


def _sdist(path: Path, members: dict[str, bytes]) -> Path:
    import io

    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("hostile, message", [
    ("truncated", "not a readable source distribution (EOFError"),
    ("not an archive", "not a readable source distribution (ReadError"),
    ("a ../ member", "member 'vllm-9.9.9/../../evil.py' escapes the archive"),
    ("an absolute member", "member '/tmp/evil.py' escapes the archive"),
    ("a member past the bound", "member 'vllm-9.9.9/vllm/big.py' holds 4097 bytes, more than 4096"),
    ("more files than the bound", "more than"),
])
def test_a_hostile_archive_is_refused_in_one_line(tmp_path, monkeypatch, hostile, message):
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(source, "MEMBER_BYTES", 4096)
    monkeypatch.setattr(source, "MEMBERS", 3)
    ok = {"vllm-9.9.9/vllm/__init__.py": b"x = 1\n"}
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    if hostile in ("truncated", "not an archive"):
        whole = _sdist(tmp_path / "whole.tar.gz", {**ok, "vllm-9.9.9/vllm/a.py": os.urandom(4000)}).read_bytes()
        archive.write_bytes(whole[: len(whole) // 2] if hostile == "truncated" else b"hello\n")
    else:
        extra = {"a ../ member": {"vllm-9.9.9/../../evil.py": b"print()"}, "an absolute member": {"/tmp/evil.py": b"print()"},
                 "a member past the bound": {"vllm-9.9.9/vllm/big.py": b"#" * 4097},
                 "more files than the bound": {f"vllm-9.9.9/vllm/m{i}.py": b"" for i in range(4)}}[hostile]
        _sdist(archive, {**ok, **extra})
    with pytest.raises(source.SourceError) as e:
        source.locate(str(archive))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not any((tmp_path / "cache" / "vllm").glob("vllm-9.9.9*")), "nothing of a refused archive stays in the cache"


class _Answer(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(("index", "download", "message"), [
    (b"<html>not json</html>", None, "the package index answered with no usable file list (JSONDecodeError"),
    (b'{"files": [{"filename": "vllm-9.9.9.tar.gz"}]}', None, "the package index answered with no usable file list (KeyError"),
    (b'{"files": [{"filename": "vllm-9.9.9.tar.gz", "url": "https://x/v.tar.gz", "hashes": {"sha256": "0"}}]}',
     OSError("connection reset"), "downloading vllm-9.9.9.tar.gz failed (connection reset)"),
], ids=["not json", "no url", "cut off"])
def test_a_bad_index_or_a_failed_download_is_one_line(tmp_path, monkeypatch, index, download, message):
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))

    def urlopen(request, timeout):
        if isinstance(request, str):  # the file itself
            raise download
        return _Answer(index)

    monkeypatch.setattr(source.urllib.request, "urlopen", urlopen)
    with pytest.raises(source.SourceError) as e:
        source.locate("9.9.9")
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not list((tmp_path / "cache").rglob("*.part")), "a cut-off download leaves nothing behind"


def test_the_cache_keeps_the_sources_used_last_within_its_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(source, "UNPACKED_BYTES", 2500)  # room for two of the three below
    paths = [_sdist(tmp_path / f"vllm-9.9.{i}.tar.gz", {f"vllm-9.9.{i}/vllm/__init__.py": os.urandom(1000)}) for i in range(3)]
    first = source.locate(str(paths[0])).root
    second = source.locate(str(paths[1])).root
    os.utime(second, (1, 1))  # used long ago
    assert source.locate(str(paths[0])).root == first  # used again: the most recent
    third = source.locate(str(paths[2])).root
    assert first.is_dir() and third.is_dir() and not second.exists()


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    archive = _sdist(tmp_path / "vllm-9.9.9.tar.gz", {"vllm-9.9.9/vllm/__init__.py": b"x = 1\n"})
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--vllm", str(archive), "--kernel", "expand_kernel",
                           "--backend", "vllm", "--profile", "dev"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECDIFF_CACHE": str(blocked / "cache")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "SPECDIFF_CACHE" in done.stderr, done.stderr


def test_a_bad_vllm_argument_is_a_clean_error_naming_it(tmp_path, capsys, monkeypatch):
    from conformance.cli import main

    monkeypatch.setenv(engine.ENV, "")  # the run points the engine at the bad path; restored after

    assert main(["run", "--vllm", str(tmp_path / "nowhere.txt"), "--kernel", "expand_kernel"]) == 2
    assert "--vllm" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"def expand_kernel(:\n", b"# \xff\xfe not UTF-8\n"], ids=["syntax", "bytes"])
def test_a_vllm_module_that_is_not_python_is_one_line_before_any_case(tmp_path, capsys, monkeypatch, content):
    from conformance.cli import main

    monkeypatch.setenv(engine.ENV, "")
    monkeypatch.chdir(tmp_path)  # a refused run writes no report over the last one
    tree = tmp_path / "vllm-tree"
    module = tree / "vllm/v1/sample/rejection_sampler.py"
    module.parent.mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    module.write_bytes(content)
    case = save_case(Case("expand_kernel", {"output_ptr": torch.zeros(0, dtype=torch.int32), "input_ptr": torch.zeros(0, dtype=torch.int32),
                                            "cu_num_tokens_ptr": torch.zeros(0, dtype=torch.int32), "replace_from": 0,
                                            "replace_to": 1, "MAX_NUM_TOKENS": 2}), tmp_path / "case.safetensors")
    for argv in (["run", "--vllm", str(tree), "--backend", "vllm", "--kernel", "expand_kernel"],
                 ["list", "--vllm", str(tree)], ["replay", str(case), "--vllm", str(tree), "--backend", "vllm"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "rejection_sampler.py: not a Python module" in err[0], (argv, err)
    assert not (tmp_path / "reports").exists()


def test_the_registration_unit_copies_schemas_and_declarations():
    bindings = '''
namespace cpu_utils {
void frob_impl(torch::Tensor& out, const int64_t n);
}  // namespace cpu_utils
  ops.def(
      "frob_impl(Tensor(a0!) out, "
      "SymInt n) -> ()",
      &cpu_utils::frob_impl);
'''
    unit = cpu.registration(bindings, ["frob_impl"])
    assert 'ops.def("frob_impl(Tensor(a0!) out, SymInt n) -> ()", &cpu_utils::frob_impl);' in unit
    assert "namespace cpu_utils { void frob_impl(torch::Tensor& out, const int64_t n); }" in unit
    with pytest.raises(source.SourceError, match="missing_impl"):
        cpu.registration(bindings, ["missing_impl"])


def test_expected_findings_are_data_and_each_names_a_registered_backend():
    known = findings.expected()
    assert len({e.id for e in known}) == len(known)
    assert all(e.backend in BACKENDS and e.defect for e in known)


def test_a_finding_no_entry_lists_is_new(tmp_path):
    from conformance.runner import Diff

    path = tmp_path / "expected.toml"
    entry = 'id = "X"\nkernel = "expand_kernel"\nbackend = "vllm-cpu"\noutput = "output_ptr"\nkind = "value"\nrule = "C18 expansion"\n'
    path.write_text(f'[[finding]]\n{entry}defect = "d"\n[[finding]]\n{entry.replace("X", "Z").replace("value", "unwritten")}defect = "e"\n')
    found = findings.Findings()
    case = Case("expand_kernel", {"output_ptr": torch.zeros(1)})
    found.add(case, Diff("vllm-cpu", "output_ptr", "value", "C18 expansion"), "m")
    found.add(case, Diff("vllm-cpu", "output_ptr", "stray write", "C18 expansion"), "m")
    unseen = findings.mark_expected(found, findings.expected(path))
    assert {f.kind: f.expected for f in found} == {"value": "X", "stray write": None}
    assert [e.id for e in unseen] == ["Z"]
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[[finding]]\n{entry}")
    with pytest.raises(ValueError, match="defect"):
        findings.expected(bad)


# Two reports of one case in vLLM's CPU port as ASan (recover mode) prints them, then one elsewhere.
ASAN_LOG = """\
==7==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020 at pc 0x7f bp 0x7f sp 0x7f
READ of size 8 at 0x6020 thread T1
    #0 0x7f01 in copy_and_expand_dflash_inputs_kernel_impl(at::Tensor const&) /c/vllm-0.33.0/csrc/cpu/spec_decode_utils.cpp:255
    #1 0x7f02 in __kmp_invoke_microtask (/usr/lib/llvm-14/lib/libomp.so.5+0xb1)
==7==ERROR: AddressSanitizer: SEGV on unknown address 0x5fff (pc 0x7f bp 0x7f sp 0x7f T1)
==7==The signal is caused by a READ memory access.
    #0 0x7f03 in copy_and_expand_dflash_inputs_kernel_impl(at::Tensor const&) /c/vllm-0.33.0/csrc/cpu/spec_decode_utils.cpp:276
==9==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6030 at pc 0x7f bp 0x7f sp 0x7f
    #0 0x7f04 in expand_kernel_impl(at::Tensor&) /c/vllm-0.33.0/csrc/cpu/spec_decode_utils.cpp:40
"""


def test_an_asan_report_no_entry_lists_is_new():
    from conformance.tools import sanitize

    found = sanitize.asan_findings(ASAN_LOG)
    assert found == {("heap-buffer-overflow", "copy_and_expand_dflash_inputs_kernel_impl", "cpu/spec_decode_utils.cpp:255"): 1,
                     ("SEGV", "copy_and_expand_dflash_inputs_kernel_impl", "cpu/spec_decode_utils.cpp:276"): 1,
                     ("heap-buffer-overflow", "expand_kernel_impl", "cpu/spec_decode_utils.cpp:40"): 1}
    # The shipped list knows D7 both ways it shows under ASan; an access it does not list is new.
    assert sanitize.unlisted(found, findings.expected()) == ["expand_kernel: heap-buffer-overflow in expand_kernel_impl"]
    assert len(sanitize.unlisted(found, [])) == 3


def test_list_names_why_an_engine_backend_is_unavailable(capsys, monkeypatch):
    from conformance.cli import main

    monkeypatch.setenv(engine.ENV, "")
    engine.use("")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "expand_kernel" in out and "(backend vllm: no vLLM named" in out


def test_list_names_the_cpu_ports_kernels_without_building_it(vllm, tmp_path):
    # Listing reads vLLM's override table from its source; building its CPU ops (a minute or more) is
    # for a run that launches them.
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-m", "conformance", "list", "--vllm", str(vllm.root)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "SPECDIFF_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("rejection_greedy_sample_kernel "))
    assert row.split()[-1] == "vllm-cpu" and "vllm," in row, row
    assert not (cache / "vllm-cpu").exists(), sorted(p.name for p in cache.rglob("*"))[:10]
