"""SGLang as a second engine: located from a pinned wheel or a path, its Triton kernels loaded by the
engine loader under their own root package, each engine's backends reading the other's kernels n/a.

The parts that need no SGLang run on archives and trees made here. The tests of SGLang 0.5.23 itself
need its wheel: ``SPECDIFF_SGLANG`` (a release or a path), or the release already in the cache
(``nox -s engine -- --sglang 0.5.23`` leaves it there); without either they skip, saying so. None of
them reaches the network: the package index is answered here.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import contracts
from conformance import cli, engine
from conformance.backend import engine_of
from conformance.backends import BACKENDS
from conformance.engine import cpu, sglang, source
from conformance.engine.source import SGLANG, SourceError
from conformance.suite import available

ROOT = Path(__file__).resolve().parent.parent
VERSION = "9.9.9"

# A Triton kernel under SGLang's root package: its module imports what only a full SGLang has (never
# executed: the loader runs what a kernel names), and its helper comes from another sglang module.
SPEC_TREE = '''\
import triton
import triton.language as tl

from sglang.srt.platforms import current_platform
from sglang.kernels.ops.speculative.helpers import twice


@triton.jit
def doubling_kernel(out_ptr, in_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(out_ptr + i, twice(tl.load(in_ptr + i)))


def host_wrapper(x):
    raise AssertionError("a host function is never executed to find out what it is")
'''
HELPERS = '''\
import triton
import triton.language as tl


@triton.jit
def twice(x):
    return tl.where(x == x, x + x, x)
'''


def _members(version: str = VERSION, spec_tree: str = SPEC_TREE) -> dict[str, bytes]:
    return {
        "sglang/__init__.py": b"",
        "sglang/_version.py": f"__version__ = version = '{version}'\n".encode(),
        "sglang/kernels/__init__.py": b"",
        "sglang/kernels/ops/__init__.py": b"",
        "sglang/kernels/ops/speculative/__init__.py": b"from sglang.kernels.registry import everything\n",
        "sglang/kernels/ops/speculative/spec_tree.py": spec_tree.encode(),
        "sglang/kernels/ops/speculative/helpers.py": HELPERS.encode(),
        "sglang/kernels/ops/sampling/murmur_hash.py": b"x = 1\n",
        "sglang/kernels/ops/speculative/notes.md": b"not a module",
        "sglang/srt/server.py": b"import everything\n",
        "sglang/srt/rust_extensions/core.so": b"\x7fELF",
        f"sglang-{version}.dist-info/METADATA": b"Name: sglang\n",
    }


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _tree(root: Path, members: dict[str, bytes] | None = None) -> Path:
    for name, data in (members or _members()).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def named() -> Iterator[None]:
    """Restores which vLLM, SGLang and sgl-kernel the process names, whatever a test names."""
    before = (engine.named(), sglang.named(), sglang.kernel_named())
    yield
    engine.use(before[0] or "")
    sglang.use(before[1] or "")
    sglang.use_kernel(before[2] or "")


# -- locating SGLang -----------------------------------------------------------------------------------
def test_a_wheel_by_path_keeps_only_the_kernel_modules(tmp_path, cache):
    src = source.locate(str(_wheel(tmp_path / f"sglang-{VERSION}-py3-none-any.whl", _members())), SGLANG)
    kept = sorted(str(p.relative_to(src.root)) for p in src.root.rglob("*") if p.is_file() and p.name != ".complete")
    assert kept == ["sglang/__init__.py", "sglang/_version.py", "sglang/kernels/__init__.py", "sglang/kernels/ops/__init__.py",
                    "sglang/kernels/ops/sampling/murmur_hash.py", "sglang/kernels/ops/speculative/__init__.py",
                    "sglang/kernels/ops/speculative/helpers.py", "sglang/kernels/ops/speculative/spec_tree.py"]
    assert src.release == VERSION and src.package == "sglang" and src.csrc is None
    assert src.root.parent == cache / "sglang"
    assert src.module_file("sglang.kernels.ops.speculative.spec_tree") == src.root / "sglang/kernels/ops/speculative/spec_tree.py"


def test_a_tree_is_taken_as_it_is_and_a_checkout_through_its_python_directory(tmp_path, cache):
    tree = _tree(tmp_path / "unpacked")
    assert source.locate(str(tree), SGLANG).root == tree
    checkout = _tree(tmp_path / "checkout" / "python")
    assert source.locate(str(tmp_path / "checkout"), SGLANG).root == checkout
    with pytest.raises(SourceError, match=r"--sglang .*must hold sglang/__init__.py"):
        source.locate(str(tmp_path), SGLANG)
    with pytest.raises(SourceError, match=r"--sglang 'nowhere' is neither an existing path nor a release version such as 0.5.23"):
        source.locate("nowhere", SGLANG)


def test_an_archive_member_of_another_engines_layout_is_not_kept():
    # Only the first levels name the tree: a vLLM sdist's tests/vllm/x.py never lands on vllm/x.py.
    assert source.VLLM.wanted("vllm-1.0/tests/vllm/x.py") is None
    assert source.VLLM.wanted("vllm-1.0/vllm/x.py") == "vllm/x.py"
    assert SGLANG.wanted("sglang-1.0/python/sglang/kernels/ops/sampling/m.py") == "sglang/kernels/ops/sampling/m.py"
    assert SGLANG.wanted("sglang-1.0/test/sglang/kernels/ops/sampling/m.py") is None
    assert SGLANG.wanted("sglang/kernels/jit/utils.py") is None


@pytest.mark.parametrize("hostile, message", [
    ("a ../ member", "member 'sglang/kernels/ops/speculative/../../../../../evil.py' escapes the archive"),
    ("an absolute member", "member '/tmp/evil.py' escapes the archive"),
    ("a member past the bound", "member 'sglang/kernels/ops/sampling/big.py' holds 4097 bytes, more than 4096 (no source file of SGLang"),
    ("not a wheel", "not a readable wheel (BadZipFile"),
])
def test_a_hostile_wheel_is_refused_in_one_line(tmp_path, cache, monkeypatch, hostile, message):
    monkeypatch.setattr(source, "MEMBER_BYTES", 4096)
    path = tmp_path / f"sglang-{VERSION}-py3-none-any.whl"
    if hostile == "not a wheel":
        path.write_bytes(b"hello\n")
    else:
        extra = {"a ../ member": {"sglang/kernels/ops/speculative/../../../../../evil.py": b"print()"},
                 "an absolute member": {"/tmp/evil.py": b"print()"},
                 "a member past the bound": {"sglang/kernels/ops/sampling/big.py": b"#" * 4097}}[hostile]
        _wheel(path, {**_members(), **extra})
    with pytest.raises(SourceError) as e:
        source.locate(str(path), SGLANG)
    assert message in str(e.value) and str(e.value).startswith("--sglang ") and "\n" not in str(e.value), str(e.value)
    assert not any((cache / "sglang").glob("sglang-*")), "nothing of a refused wheel stays in the cache"
    assert not (tmp_path / "evil.py").exists()


class _Answer(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _index(monkeypatch, wheel: bytes, digest: str | None = None) -> list[str]:
    """Answers the package index for sglang: six wheels of VERSION (no sdist), as SGLang publishes them,
    each listed with ``wheel``'s SHA-256 (or ``digest``); returns the URLs fetched."""
    names = [f"sglang-{VERSION}-cp3{v}-cp3{v}-manylinux_2_34_{arch}.whl" for v in (11, 12, 13) for arch in ("aarch64", "x86_64")]
    files = [{"filename": n, "url": f"https://files.example/{n}", "hashes": {"sha256": digest or hashlib.sha256(wheel).hexdigest()}}
             for n in [*reversed(names), f"sglang-{VERSION}1-py3-none-any.whl"]]
    fetched: list[str] = []

    def urlopen(request, timeout):
        if isinstance(request, str):
            fetched.append(request)
            return _Answer(wheel)
        assert request.full_url.endswith("/sglang/"), request.full_url
        return _Answer(json.dumps({"files": files}).encode())

    monkeypatch.setattr(source.urllib.request, "urlopen", urlopen)
    return fetched


def test_a_release_is_one_pinned_wheel_checked_against_the_index(tmp_path, cache, monkeypatch):
    wheel = _wheel(tmp_path / "w.whl", _members()).read_bytes()
    fetched = _index(monkeypatch, wheel)
    src = source.locate(VERSION, SGLANG)
    pinned = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert fetched == [f"https://files.example/{pinned}"]
    assert (cache / "downloads" / pinned).read_bytes() == wheel and src.release == VERSION

    def unreachable(request, timeout):
        raise OSError("no network")

    monkeypatch.setattr(source.urllib.request, "urlopen", unreachable)  # cached: the index is not asked again
    assert source.locate(VERSION, SGLANG).root == src.root


def test_a_wheel_that_does_not_match_the_indexs_digest_is_refused(tmp_path, cache, monkeypatch):
    wheel = _wheel(tmp_path / "w.whl", _members()).read_bytes()
    _index(monkeypatch, wheel, digest="0" * 64)
    with pytest.raises(SourceError) as e:
        source.locate(VERSION, SGLANG)
    assert "does not match the index's SHA-256" in str(e.value) and str(e.value).startswith(f"--sglang {VERSION}:"), str(e.value)
    assert not list((cache / "downloads").iterdir()), "a refused download leaves nothing behind"


def test_a_release_the_index_has_no_wheel_of_is_one_line(cache, monkeypatch):
    _index(monkeypatch, b"")
    with pytest.raises(SourceError, match=r"^--sglang 1\.2\.3: the package index has no wheel of sglang 1\.2\.3$"):
        source.locate("1.2.3", SGLANG)


# -- loading its kernels -------------------------------------------------------------------------------
def test_the_loader_loads_a_kernel_under_another_root_package(tmp_path, cache, named):
    sglang.use(str(_tree(tmp_path / "tree")))
    loader = sglang.SGLANG.loader()
    assert loader.root == "sglang"
    kernel = loader.kernel("sglang.kernels.ops.speculative.spec_tree.doubling_kernel")
    x = torch.tensor([1, -2, 3, 40], dtype=torch.int32)
    out = torch.zeros_like(x)
    kernel[(1,)](out, x, n=4)
    assert out.tolist() == [2, -4, 6, 80]
    assert loader.is_triton("sglang.kernels.ops.speculative.spec_tree.doubling_kernel")
    assert not loader.is_triton("sglang.kernels.ops.speculative.spec_tree.host_wrapper")  # never executed (it would raise)
    assert not loader.is_triton("sglang.kernels.ops.speculative.spec_tree.absent_kernel")
    # A vLLM qualname is nothing of SGLang's source.
    assert loader.kernel("vllm.v1.sample.rejection_sampler.expand_kernel") is None


def _spec(qualname: str, **changes) -> contracts.KernelSpec:
    """A throwaway contract: expand_kernel's parameters under another engine's qualname."""
    return dataclasses.replace(contracts.get("expand_kernel"), name=qualname.rpartition(".")[2], qualname=qualname, **changes)


def test_each_engines_backends_read_the_others_kernels_as_na():
    vllm_spec = contracts.get("expand_kernel")
    theirs = _spec("sglang.kernels.ops.speculative.spec_tree.doubling_kernel")
    op = _spec("torch.ops.sgl_kernel.verify_tree_greedy_cpu")
    assert [engine_of(s) for s in (vllm_spec, theirs, op)] == ["vllm", "sglang", "sglang"]
    for b in ("vllm", "vllm-cpu"):
        assert BACKENDS[b].applies(vllm_spec) and not BACKENDS[b].applies(theirs) and not BACKENDS[b].applies(op)
        assert BACKENDS[b].inapplicable(theirs) == (f"doubling_kernel is SGLang's kernel ({theirs.qualname}); {b} runs vLLM's")
    for b in ("sglang", "sglang-cpu"):
        assert not BACKENDS[b].applies(vllm_spec)
        assert BACKENDS[b].inapplicable(vllm_spec) == f"expand_kernel is vLLM's kernel ({vllm_spec.qualname}); {b} runs SGLang's"
    assert BACKENDS["sglang"].applies(theirs)
    for b in ("reference", "triton", "cpu"):  # specdiff's own backends implement every engine's contracts
        assert BACKENDS[b].applies(theirs)


def test_sglangs_kernels_without_a_form_on_a_backend_are_na_with_the_reason():
    target_only = _spec(sglang.TARGET_ONLY)
    chain = _spec(sglang.CHAIN)
    assert not BACKENDS["sglang"].applies(target_only)
    assert "CUDA kernel compiled at run time" in BACKENDS["sglang"].inapplicable(target_only)
    assert BACKENDS["sglang"].applies(chain)
    assert not BACKENDS["sglang-cpu"].applies(chain)
    assert "on a CPU it verifies greedily whatever the temperature" in BACKENDS["sglang-cpu"].inapplicable(chain)


def test_the_run_reports_another_engines_kernel_as_na_not_missing(named):
    mine = next((s for s in contracts.SPECS.values() if engine_of(s) == "sglang"), None)
    if mine is None:
        pytest.skip("no contract of an SGLang kernel yet")
    engine.use("")
    sglang.use("")
    _, vllm_side = available(mine.name, ["reference", "vllm", "vllm-cpu"], set())
    _, sglang_side = available("expand_kernel", ["reference", "sglang", "sglang-cpu"], set())
    assert {e["status"] for e in vllm_side.values()} == {"n/a"} and set(vllm_side) == {"vllm", "vllm-cpu"}
    assert {e["status"] for e in sglang_side.values()} == {"n/a"} and set(sglang_side) == {"sglang", "sglang-cpu"}
    assert "is SGLang's kernel" in vllm_side["vllm"]["message"] and "is vLLM's kernel" in sglang_side["sglang"]["message"]


def test_a_known_findings_releases_are_its_backends_engines(tmp_path):
    from conformance import findings

    path = tmp_path / "expected.toml"
    entry = 'kernel = "k"\noutput = "o"\nkind = "value"\nrule = "r"\ndefect = "d"\nreleases = ["0.5.23"]\n'
    path.write_text(f'[[finding]]\nid = "S1"\nbackend = "sglang"\n{entry}[[finding]]\nid = "V1"\nbackend = "vllm"\n{entry}')
    assert [e.id for e in findings.expected(path, {"vllm": "0.33.0", "sglang": "0.5.23"})] == ["S1"]
    assert [e.id for e in findings.expected(path, {"vllm": "0.5.23", "sglang": "0.5.24"})] == ["V1"]
    assert [e.id for e in findings.expected(path, "0.5.23")] == ["V1"]  # one release string: vLLM's


# -- the command line ----------------------------------------------------------------------------------
def _ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"backend": None, "kernel": None, "vllm": None, "sglang": None, "sglang_kernel": None, **kw})


def test_sglang_on_the_command_line_adds_its_backends_and_its_kernels(tmp_path, cache, named):
    engine.use("")
    tree = str(_tree(tmp_path / "tree"))
    kernels, backends = cli.select(_ns(sglang=tree))
    assert backends == ["reference", "triton", "cpu", "sglang", "sglang-cpu"]
    assert kernels == [k for k, s in contracts.SPECS.items() if engine_of(s) == "sglang"]
    assert os.environ[sglang.SGLANG.env] == tree  # inherited by the run's child processes
    vllm_tree = tmp_path / "vllm-tree"
    (vllm_tree / "vllm").mkdir(parents=True)
    (vllm_tree / "vllm" / "__init__.py").write_text("")
    kernels, backends = cli.select(_ns(sglang=tree, vllm=str(vllm_tree)))
    assert backends == ["reference", "triton", "cpu", "vllm", "vllm-cpu", "sglang", "sglang-cpu"]
    assert kernels == list(contracts.SPECS)
    kernels, backends = cli.select(_ns(sglang=tree, backend=["cpu", "sglang"], kernel=["expand_kernel"]))
    assert (kernels, backends) == (["expand_kernel"], ["reference", "cpu", "sglang"])


@pytest.mark.parametrize("argv, message", [
    (["run", "--backend", "sglang", "--kernel", "expand_kernel"], "--backend sglang: SGLang's own kernels need SGLang: --sglang VERSION|PATH"),
    (["run", "--sglang", "nowhere.txt", "--kernel", "expand_kernel"], "--sglang 'nowhere.txt' is neither an existing path"),
    (["run", "--sglang=nowhere.txt", "--kernel", "expand_kernel"], "--sglang 'nowhere.txt' is neither an existing path"),
    (["list", "--sglang", "nowhere.txt"], "--sglang 'nowhere.txt' is neither an existing path"),
])
def test_a_bad_sglang_argument_is_one_line_naming_it(tmp_path, capsys, monkeypatch, named, argv, message):
    monkeypatch.setenv(sglang.SGLANG.env, "")
    monkeypatch.chdir(tmp_path)  # a refused run writes no report
    try:
        code = cli.main(argv)
    except SystemExit as e:  # a usage error, as argparse reports one
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and "Traceback" not in "\n".join(err), err
    assert not (tmp_path / "reports").exists()


def test_the_cpu_op_backend_is_unavailable_in_one_line_until_a_checkout_is_named(tmp_path, named):
    sglang.use_kernel("")
    why = BACKENDS["sglang-cpu"].unavailable()
    assert why is not None and "\n" not in why and "--sglang-kernel PATH" in why and "not on the package index" in why
    sglang.use_kernel(str(tmp_path))
    assert "no sgl-kernel/csrc/cpu/spec.cpp under it" in BACKENDS["sglang-cpu"].unavailable()
    d = tmp_path / "sgl-kernel" / "csrc" / "cpu"
    d.mkdir(parents=True)
    (d / "spec.cpp").write_text("")
    assert BACKENDS["sglang-cpu"].unavailable().endswith("has spec.cpp but no common.h or torch_extension_cpu.cpp")
    (d / "common.h").write_text("")
    (d / "torch_extension_cpu.cpp").write_text("")
    assert BACKENDS["sglang-cpu"].unavailable() is None


def test_the_registration_unit_of_sglangs_fragment_copies_schema_and_declaration():
    bindings = '''
void verify_tree_greedy_cpu(at::Tensor predicts, const at::Tensor& candidates);
TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
  m.def("verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor candidates) -> ()");
  m.impl("verify_tree_greedy_cpu", torch::kCPU, &verify_tree_greedy_cpu);
}
'''
    unit = cpu.registration(bindings, ["verify_tree_greedy_cpu"], binder="m", namespace="sgl_kernel", origin="x.cpp")
    assert "TORCH_LIBRARY(sgl_kernel, m) {" in unit
    assert 'm.def("verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor candidates) -> ()", &verify_tree_greedy_cpu);' in unit
    assert "void verify_tree_greedy_cpu(at::Tensor predicts, const at::Tensor& candidates);" in unit
    with pytest.raises(SourceError, match=r"^x.cpp has no `m.def\(\"other_cpu"):
        cpu.registration(bindings, ["other_cpu"], binder="m", namespace="sgl_kernel", origin="x.cpp")


# -- SGLang 0.5.23 itself ------------------------------------------------------------------------------
def sglang_spec() -> str | None:
    """The SGLang these tests use: SPECDIFF_SGLANG, else 0.5.23 when its wheel is already in the cache."""
    spec = os.environ.get(sglang.SGLANG.env)
    if spec:
        return spec
    downloads = source.cache_dir() / "downloads"
    cached = SGLANG.pick("0.5.23", [p.name for p in downloads.iterdir()]) if downloads.is_dir() else None
    return "0.5.23" if cached else None


@pytest.fixture(scope="module")
def sglang_0_5_23() -> Iterator[source.Source]:
    spec = sglang_spec()
    if spec is None:
        pytest.skip(f"no SGLang: set {sglang.SGLANG.env} (a release or its wheel) or run `nox -s engine -- --sglang 0.5.23` once")
    before = sglang.named()
    sglang.use(spec)
    yield sglang.SGLANG.located()
    sglang.use(before or "")


def test_every_sglang_contract_names_a_kernel_with_its_parameters_or_reads_na(sglang_0_5_23):
    mine = [s for s in contracts.SPECS.values() if engine_of(s) == "sglang"]
    if not mine:
        pytest.skip("no contract of an SGLang kernel yet")
    for spec in mine:
        backend = BACKENDS["sglang"]
        if not backend.applies(spec):
            assert spec.qualname in sglang.NO_TRITON and not sglang.SGLANG.loader().is_triton(spec.qualname), spec.name
            continue
        kernel = backend.resolve(spec)
        assert kernel is not None and tuple(kernel.arg_names) == spec.arg_names, spec.name


def test_sglangs_greedy_tree_kernel_walks_a_hand_worked_tree(sglang_0_5_23):
    # A request with root 5 and children 7 (first) and 6 (its sibling) at slots 1 and 2; 7 has child 8 at
    # slot 3. The target's argmax is 6 after the root, 9 after 6: the first child is rejected, its sibling
    # accepted, and 6 has no child, so the walk stops with one draft accepted and the bonus 9 at slot 2.
    kernel = sglang.SGLANG.loader().kernel(sglang.GREEDY)
    t = torch.tensor
    predicts, accept, num = torch.zeros(4, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    kernel[(1,)](predicts, accept, num, t([[5, 7, 6, 8]]), t([[0, 1, 2, 3]]), t([[1, 3, -1, -1]]), t([[-1, 2, -1, -1]]),
                 t([[6, 8, 9, 4]]), batch_size=1, num_speculative_tokens=3, num_draft_tokens=4)
    assert predicts.tolist() == [6, 0, 9, 0] and accept.tolist() == [[0, 2, -1]] and num.tolist() == [1]


@pytest.mark.parametrize("coin, predicts, accepted, num", [
    # Draft 1 has p = 0.25, q = 0.5. At coin 0.5, coin * q = 0.25 is not < p: rejected; the residual
    # max(p - q, 0) of row 0, [0.25, 0.25, 0.5] - [0.25, 0.5, 0.25], is [0, 0, 0.25], so the final draw
    # gives token 2 at the root's slot. Just below, 0.4999 * 0.5 < 0.25: accepted (token 1 at the root's
    # slot), and the bonus comes from row 1, [0, 1, 0], at the draft's slot.
    (0.5, [2, 0], [[0, -1]], 0),
    (0.4999, [1, 1], [[0, 1]], 1),
])
def test_sglangs_chain_sampler_decides_a_hand_worked_boundary(sglang_0_5_23, coin, predicts, accepted, num):
    kernel = sglang.SGLANG.loader().kernel(sglang.CHAIN)
    cand, idx = torch.tensor([[0, 1]]), torch.tensor([[0, 1]])
    coins, final = torch.tensor([[coin, 0.0]]), torch.tensor([0.5])
    p = torch.tensor([[[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]]])
    q = torch.tensor([[[0.25, 0.5, 0.25]]])
    out, acc, n = torch.zeros(2, dtype=torch.int32), torch.full((1, 2), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    kernel[(1,)](out, acc, n, cand, idx, coins, final, p, q, *cand.stride(), *idx.stride(), *coins.stride(), *p.stride(), *q.stride(),
                 NUM_SLOTS=2, VOCAB_SIZE=3, BLOCK_V=4096, BLOCK_REDUCE=4)
    assert (out.tolist(), acc.tolist(), n.tolist()) == (predicts, accepted, [num])


# -- sglang-cpu, built from a checkout -----------------------------------------------------------------
# A stand-in sgl-kernel checkout (its csrc/cpu as SGLang lays it out): an op with verify_tree_greedy_cpu's
# schema and checks, written here, and a common.h without CHECK_GE (older ones lack it; the build supplies it).
COMMON_H = """\
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#define CHECK_CPU(x) TORCH_CHECK(x.device().type() == at::kCPU, #x " must be a CPU tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CPU(x); CHECK_CONTIGUOUS(x)
#define CHECK_EQ(a, b) TORCH_CHECK((a) == (b), "CHECK_EQ(" #a ", " #b ") failed")
"""
SPEC_CPP = """\
#include "common.h"

// The greedy walk: at each level, the first sibling whose token is the target's argmax at the last
// accepted slot is accepted; the target's argmax at the last accepted slot is written there at the end.
void verify_tree_greedy_cpu(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
                            const at::Tensor& candidates, const at::Tensor& retrive_index,
                            const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                            const at::Tensor& target_predict) {
  CHECK_INPUT(predicts); CHECK_INPUT(accept_index); CHECK_INPUT(accept_token_num); CHECK_INPUT(candidates);
  CHECK_INPUT(retrive_index); CHECK_INPUT(retrive_next_token); CHECK_INPUT(retrive_next_sibling);
  CHECK_INPUT(target_predict);
  CHECK_EQ(predicts.scalar_type(), at::kInt);
  CHECK_EQ(candidates.scalar_type(), at::kLong);
  const int64_t bs = candidates.size(0), n = candidates.size(1), steps = accept_index.size(1);
  CHECK_GE(steps, 1);
  CHECK_EQ(predicts.numel(), bs * n);
  int32_t* out = predicts.data_ptr<int32_t>();
  int32_t* accepted = accept_index.data_ptr<int32_t>();
  int32_t* count = accept_token_num.data_ptr<int32_t>();
  const int64_t* token = candidates.data_ptr<int64_t>();
  const int64_t* slot = retrive_index.data_ptr<int64_t>();
  const int64_t* child = retrive_next_token.data_ptr<int64_t>();
  const int64_t* sibling = retrive_next_sibling.data_ptr<int64_t>();
  const int64_t* target = target_predict.data_ptr<int64_t>();
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t row = b * n;
    int64_t last = slot[row], node = 0;
    int32_t num = 0;
    accepted[b * steps] = static_cast<int32_t>(last);
    for (int64_t level = 1; level < steps; ++level) {
      node = child[row + node];
      while (node != -1 && token[row + node] != target[last]) node = sibling[row + node];
      if (node == -1) break;
      out[last] = static_cast<int32_t>(target[last]);
      last = slot[row + node];
      accepted[b * steps + ++num] = static_cast<int32_t>(last);
    }
    count[b] = num;
    out[last] = static_cast<int32_t>(target[last]);
  }
}
"""
BINDINGS = """\
#include <torch/all.h>
#include <torch/library.h>

void verify_tree_greedy_cpu(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
    const at::Tensor& candidates, const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
    const at::Tensor& retrive_next_sibling, const at::Tensor& target_predict);

TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
  m.def(
      "verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
      "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
      "Tensor target_predict) -> ()");
  m.impl("verify_tree_greedy_cpu", torch::kCPU, &verify_tree_greedy_cpu);
}
"""


def test_sglang_cpu_builds_a_checkouts_op_and_launches_it_as_the_call_site_does(tmp_path, monkeypatch, named):
    spec = contracts.SPECS.get("verify_tree_greedy_kernel_triton")
    if spec is None or engine_of(spec) != "sglang":
        pytest.skip("no contract of SGLang's greedy tree kernel yet")
    if hasattr(torch.ops.sgl_kernel, "verify_tree_greedy_cpu"):
        pytest.skip("an sgl_kernel library is already loaded in this process")
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "sglang" / "sgl-kernel" / "csrc" / "cpu"
    tree.mkdir(parents=True)
    for name, text in (("common.h", COMMON_H), ("spec.cpp", SPEC_CPP), ("torch_extension_cpu.cpp", BINDINGS)):
        (tree / name).write_text(text)
    sglang.use_kernel(str(tmp_path / "sglang"))
    kernel = BACKENDS["sglang-cpu"].resolve(spec)
    assert list((tmp_path / "cache" / "sglang-cpu").glob("ops-*.so")), "built into the cache"
    # The tree of test_sglangs_greedy_tree_kernel_walks_a_hand_worked_tree, in the contract's flat and 2-D layout.
    t = torch.tensor
    predicts, accept, num = torch.zeros(4, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    BACKENDS["sglang-cpu"].launcher(kernel, (1,))(
        predicts_ptr=predicts, accept_index_ptr=accept, accept_token_num_ptr=num, candidates_ptr=t([[5, 7, 6, 8]]),
        retrieve_index_ptr=t([[0, 1, 2, 3]]), retrieve_next_token_ptr=t([[1, 3, -1, -1]]),
        retrieve_next_sibling_ptr=t([[-1, 2, -1, -1]]), target_predict_ptr=t([[6, 8, 9, 4]]),
        batch_size=1, num_speculative_tokens=3, num_draft_tokens=4)
    assert predicts.tolist() == [6, 0, 9, 0] and accept.tolist() == [[0, 2, -1]] and num.tolist() == [1]
    # What the op refuses it refuses as a Python error (a declared capability: counted unsupported).
    with pytest.raises(RuntimeError, match="predicts must be contiguous"):
        kernel[(1,)](torch.zeros(8, dtype=torch.int32)[::2], accept, num, t([[5, 7, 6, 8]]), t([[0, 1, 2, 3]]),
                     t([[1, 3, -1, -1]]), t([[-1, 2, -1, -1]]), t([[6, 8, 9, 4]]), 1, 3, 4)
