"""Saved cases are data: they come back exactly (aliasing, strided and lazy views, exact scalars),
and a file that is not a well-formed case, or one that would run code, is a ValueError naming it."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from conformance.case import Case
from conformance.casefile import load_case, save_case
from contracts.spec import Table

KERNEL = "rejection_greedy_sample_kernel"
ROOT = Path(__file__).resolve().parents[1]


def _saved(tmp_path):
    wide = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    args = {"a": wide, "b": wide, "col": wide[:, 2:4], "c": torch.tensor([1.5, -2.0]), "n": 7}
    return save_case(Case(KERNEL, args), tmp_path / "case.safetensors")


def _rewrite(path, change):
    """Writes ``path`` again with its JSON document (and storages) passed through ``change``."""
    with safe_open(str(path), framework="pt") as f:
        doc = json.loads(f.metadata()["specdiff"])
        blobs = {k: f.get_tensor(k) for k in f.keys()}
    change(doc, blobs)
    path.write_bytes(safetensors.torch.save(blobs, metadata={"specdiff": json.dumps(doc)}))
    return path


def test_a_case_comes_back_with_its_aliasing_views_and_exact_scalars(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDIFF_VLLM", raising=False)  # else save_case records it in meta (CI names one)
    wide = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    z = torch.randn(3, dtype=torch.complex64)
    args = {
        "a": wide, "b": wide,                           # one tensor bound to two parameters
        "col": wide[:, 2:4],                            # a column slice of a wider buffer
        "bits": wide.view(torch.float32)[1],            # the same bytes as another dtype, at an offset
        "neg": z.conj().imag,                           # a lazy negative view (strided, offset 1)
        "empty": torch.empty(0, dtype=torch.int64),
        "nan": float("nan"), "negzero": -0.0, "big": 2**80, "flag": True, "none": None, "name": "x",
    }
    path = save_case(Case(KERNEL, args, grid=(4, 2), positional=True, note="why"), tmp_path / "c.safetensors", {"backends": ["cpu"]})
    case = load_case(path)
    got = case.args
    assert got["a"] is got["b"]
    base = got["a"].untyped_storage().data_ptr()
    for name in ("col", "bits"):
        assert got[name].untyped_storage().data_ptr() == base, name
    assert got["col"].data_ptr() - got["a"].data_ptr() == 2 * 4 and got["col"].stride() == (6, 1) and got["col"].shape == (4, 2)
    assert got["bits"].dtype == torch.float32 and got["bits"].data_ptr() - got["a"].data_ptr() == 6 * 4
    assert torch.equal(got["a"], wide) and torch.equal(got["col"], wide[:, 2:4])
    assert torch.equal(got["bits"].view(torch.int32), wide[1])
    assert got["neg"].is_neg() and got["neg"].stride() == (2,) and got["neg"].storage_offset() == 1
    assert torch.equal(got["neg"], z.conj().imag)
    assert got["empty"].shape == (0,) and got["empty"].dtype == torch.int64
    assert math.isnan(got["nan"]) and math.copysign(1, got["negzero"]) == -1 and got["big"] == 2**80
    assert (got["flag"], got["none"], got["name"]) == (True, None, "x")
    assert (case.kernel, case.grid, case.positional, case.note, case.meta) == (KERNEL, (4, 2), True, "why", {"backends": ["cpu"]})


def test_the_fuzz_s_malformed_values_come_back(tmp_path):
    args = {"meta": torch.zeros(2, 3).to("meta"), "cplx": torch.tensor([1 + 2j], dtype=torch.complex64),
            "nested": [[1.5, float("inf")], [complex(0, -1)], [True, 3]], "array": np.arange(4, dtype=np.int16)[::2]}
    got = load_case(save_case(Case(KERNEL, args), tmp_path / "c.safetensors")).args
    assert got["meta"].device.type == "meta" and got["meta"].shape == (2, 3)
    assert torch.equal(got["cplx"], args["cplx"])
    assert got["nested"] == args["nested"] and type(got["nested"][2][0]) is bool
    assert isinstance(got["array"], np.ndarray) and got["array"].tolist() == [0, 2] and got["array"].strides == (4,)


class _Payload:
    """Unpickling this creates the file ``path``: what a hostile replay file would do, harmlessly."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_pickle_is_refused_without_running_it(tmp_path, how):
    marker = tmp_path / "ran"
    run, args = _Payload(tmp_path / "proof").__reduce__()  # what unpickling would call: the payload is live
    run(*args).close()
    assert (tmp_path / "proof").exists()
    path = tmp_path / "case.pt"
    if how == "pickle":
        path.write_bytes(pickle.dumps({"kernel": KERNEL, "args": {"x": _Payload(marker)}}))
    else:
        torch.save({"kernel": KERNEL, "args": {"x": _Payload(marker)}}, path)
    with pytest.raises(ValueError, match=r"case\.pt.*unsupported.*no version field"):
        load_case(path)
    assert not marker.exists()


def test_a_truncated_file_is_a_value_error_naming_it(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    for cut in (len(data) - 3, 40, 5, 0):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"case\.safetensors' is not a saved case"):
            load_case(path)


def test_a_missing_file_or_foreign_safetensors_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_case(tmp_path / "nope.safetensors")
    other = tmp_path / "weights.safetensors"
    other.write_bytes(safetensors.torch.save({"w": torch.zeros(2)}))
    with pytest.raises(ValueError, match="unsupported format.*no version field"):
        load_case(other)


def test_a_pointer_table_comes_back_as_its_tensors(tmp_path):
    wide = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    args = {"t": Table((wide, wide[:, 1:], torch.zeros((2, 0), dtype=torch.int32))), "w": wide}
    got = load_case(save_case(Case(KERNEL, args), tmp_path / "t.safetensors")).args
    assert isinstance(got["t"], Table) and len(got["t"]) == 3
    assert got["t"][0] is got["w"] and torch.equal(got["t"][1], wide[:, 1:]) and got["t"][1].stride() == (4, 1)
    assert got["t"][2].shape == (2, 0)


def _set(field, value):
    def change(doc, blobs):
        where = doc
        *path, last = field
        for k in path:
            where = where[k]
        if value is _DELETE:
            del where[last]
        else:
            where[last] = value
    return change


_DELETE = object()
_A = ("args", "a", "tensor")


@pytest.mark.parametrize("change, message", [
    (_set(("version",), 2), "unsupported version 2"),
    (_set(("version",), _DELETE), "no version field"),
    (_set(("version",), True), "unsupported version True"),
    (_set(("format",), "torch"), "unsupported format"),
    (_set(("grid",), [1, -1]), "'grid'"),
    (_set((*_A, "dtype"), "float128"), "dtype 'float128' is not one of"),
    (_set((*_A, "dtype"), "object"), "dtype 'object'"),
    (_set((*_A, "size"), [4, 7]), "reaches byte"),                 # one more column than the storage holds
    (_set((*_A, "stride"), [1 << 62, 1]), "beyond int64"),         # no wrap-around: Python ints
    (_set((*_A, "stride"), [-6, 1]), "non-negative"),
    (_set((*_A, "size"), [4]), "same length"),
    (_set((*_A, "byte_offset"), 2), "multiple of 4"),
    (_set((*_A, "byte_offset"), 96), "reaches byte"),
    (_set((*_A, "storage"), "s9"), "storage 's9' is not in the file"),
    (_set((*_A, "neg"), "yes"), "neg, conj and requires_grad"),
    (_set((*_A, "extra"), 1), "exactly the keys"),
    (_set(("args", "n"), {"int": 1 << 130}), "not an int of at most 128 bits"),
    (_set(("args", "n"), {"int": 1.5}), "not an int"),
    (_set(("args", "n"), {"float": "zz"}), "not a float"),
    (_set(("args", "n"), {"code": "print()"}), "'code'"),
    (_set(("args", "n"), 3), "one key"),
    (_set(("args", "n"), {"table": [{"int": 1}]}), "a table holds tensors only"),
    (_set(("args", "n"), {"table": [{"table": []}]}), "a table holds tensors only"),
    (_set(("args",), []), "'args' must be a dict"),
])
def test_a_malformed_document_is_a_value_error_naming_the_file_and_the_field(tmp_path, change, message):
    path = _rewrite(_saved(tmp_path), change)
    with pytest.raises(ValueError, match=r"case\.safetensors'") as e:
        load_case(path)
    assert message in str(e.value)


def test_a_storage_is_never_grown_to_fit_a_view(tmp_path):
    def shrink(doc, blobs):
        blobs["s0"] = blobs["s0"][:95].clone()  # one byte short of the 4 x 6 int32 buffer
    with pytest.raises(ValueError, match="reaches byte 96 of storage 's0', which holds 95 bytes"):
        load_case(_rewrite(_saved(tmp_path), shrink))


def test_garbled_metadata_and_unknown_kernels(tmp_path):
    path = _saved(tmp_path)
    with safe_open(str(path), framework="pt") as f:
        blobs = {k: f.get_tensor(k) for k in f.keys()}
    path.write_bytes(safetensors.torch.save(blobs, metadata={"specdiff": '{"format": "specdiff-case", '}))
    with pytest.raises(ValueError, match="not JSON"):
        load_case(path)
    with pytest.raises(KeyError, match="unknown kernel 'nope'; known: "):
        load_case(_rewrite(_saved(tmp_path), _set(("kernel",), "nope")))


def test_an_empty_storage_at_a_live_tensors_address_shares_nothing(tmp_path):
    # Two storages at one address, one empty (a crashing run's saved case had exactly this): keyed by
    # address alone, the live tensor came back as a view of the empty one's zero bytes.
    a = np.arange(3, dtype=np.float32)
    empty, full = torch.from_numpy(a[:0]), torch.from_numpy(a)
    assert empty.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    path = save_case(Case(KERNEL, {"empty": empty, "full": full}), tmp_path / "c.safetensors")
    got = load_case(path).args
    assert got["full"].tolist() == [0.0, 1.0, 2.0] and got["empty"].numel() == 0


def _drawn_case(tmp_path):
    """A valid rejection_greedy_sample_kernel case (three requests), saved."""
    from support import i32, i64

    args = dict(output_token_ids_ptr=torch.full((3, 3), -1, dtype=torch.int32), cu_num_draft_tokens_ptr=i32([2, 3, 5]),
                draft_token_ids_ptr=i32([1, 2, 3, 4, 5]), target_argmax_ptr=i64([1, 0, 3, 4, 0]),
                bonus_token_ids_ptr=i32([[7], [8], [9]]), is_greedy_ptr=None, max_spec_len=2, uniform_probs_ptr=None,
                synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False)
    return save_case(Case(KERNEL, args), tmp_path / "case.safetensors")


@pytest.mark.parametrize("entry", ["stride 0", "meta"])
@pytest.mark.parametrize("command", [["replay"], ["show"], ["threads", "--replay"]])
def test_a_view_of_2_to_the_40_elements_ends_in_seconds_without_a_traceback(tmp_path, entry, command):
    # 2**40 rows of one stored row (or of no bytes at all, on meta): copying it element by element, or
    # materializing it, would hang the process or exhaust memory.
    def huge(doc, blobs):
        e = doc["args"]["target_argmax_ptr"]["tensor"]
        e["size"], e["stride"] = [1 << 40], [0]
        if entry == "meta":
            e["storage"] = None
    path = _rewrite(_drawn_case(tmp_path), huge)
    assert load_case(path).args["target_argmax_ptr"].shape == (1 << 40,)
    done = subprocess.run([sys.executable, "-m", "conformance", *command, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]
    assert done.returncode in (0, 1, 2), done.stderr[-2000:]
    if done.returncode == 2:  # refused: one line naming the argument
        assert "target_argmax_ptr" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    if command == ["replay"] and done.returncode == 0:  # the contract refuses it: said, not "all backends agree"
        assert "the contract refuses this case" in done.stdout and "target_argmax_ptr" in done.stdout, done.stdout
