"""The catalogue of planted faults is well-formed and current; the machinery kills a fault end to end.
(`nox -s mutants` runs the whole catalogue; this file keeps the catalogue honest on every test run.)"""

from __future__ import annotations

from typing import Any

import pytest

import contracts
from conformance.backends import BACKENDS
from conformance.tools import mutants

CATALOGUE = mutants.load()
# The classes of fault the catalogue must hold, at least (docs/mutants.md).
REQUIRED_FAULTS = {"off-by-one offset", "strict versus non-strict comparison", "wrong bonus condition", "missing padding write",
                   "placeholder draft accepted", "wrong stride", "narrowed dtype", "data race"}


@pytest.mark.parametrize("m", CATALOGUE, ids=lambda m: m.id)
def test_every_fault_applies_to_the_current_tree(m):
    text = (mutants.ROOT / m.file).read_text()
    mutated = mutants.mutate(text, m)  # raises when the find text is gone: the catalogue is stale
    assert mutated != text
    assert m.backend in BACKENDS and m.kernels and all(k in contracts.SPECS for k in m.kernels)


def test_the_catalogue_covers_the_required_faults_on_every_backend():
    assert REQUIRED_FAULTS <= {m.fault for m in CATALOGUE}
    assert {"cpu", "triton", "reference"} <= {m.backend for m in CATALOGUE}
    assert len(CATALOGUE) >= 15


def test_occurrence_and_further_edits():
    m = mutants.Mutant("x", "cpu", "f", "a", "b", ["expand_kernel"], "f", "d", occurrence=2, also=[{"find": "c", "replace": "d"}])
    assert mutants.mutate("a a c", m) == "a b d"
    with pytest.raises(ValueError, match="occurs 2 times"):
        mutants.mutate("a a", mutants.Mutant("y", "cpu", "f", "a", "b", ["expand_kernel"], "f", "d"))


def test_a_python_fault_is_killed_end_to_end(tmp_path):
    m = next(m for m in CATALOGUE if m.id == "reference-expand-uncapped")
    s = mutants.Scratch(mutants.ROOT, tmp_path / "tree")
    try:
        row = mutants.evaluate(m, s, "dev", all_checks=False)
    finally:
        s.close()
    assert row["error"] is None and row["killed_by"] == "conformance", row
    assert (tmp_path / "tree" / m.file).exists() is False or "min(n, MAX_NUM_TOKENS)" in (tmp_path / "tree" / m.file).read_text()


def _catalogue(tmp_path, file):
    path = tmp_path / "mutants.toml"
    path.write_text(f'[[mutant]]\nid = "escape"\nbackend = "cpu"\nfile = "{file}"\nfind = "a"\nreplace = "b"\n'
                    'kernels = ["expand_kernel"]\nfault = "f"\ndescription = "d"\n')
    return path


@pytest.mark.parametrize("file", ["/etc/hostname", "../outside.py", "csrc/../../outside.py", "no/such/file.py"])
def test_a_mutant_outside_the_tree_is_refused_when_the_catalogue_loads(tmp_path, file):
    with pytest.raises(ValueError, match=f"mutant escape: file '{file}' is not a file of the tree"):
        mutants.load(_catalogue(tmp_path, file))


def test_a_symbolic_link_out_of_the_tree_is_refused(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside.py"
    tree.mkdir()
    outside.write_text("a = 1\n")
    (tree / "inside.py").write_text("a = 1\n")
    (tree / "link.py").symlink_to(outside)
    assert mutants.load(_catalogue(tmp_path, "inside.py"), root=tree)[0].file == "inside.py"
    assert "link.py" in mutants.tree_files(tree)  # listed by the tree, yet leads out of it
    with pytest.raises(ValueError, match="mutant escape: file 'link.py' is not a file of the tree"):
        mutants.load(_catalogue(tmp_path, "link.py"), root=tree)


def test_the_command_line_refuses_unknown_mutants_and_backends(capsys):
    from conformance import cli

    for argv, message in ((["--id", "no-such-mutant"], "--id: unknown mutant 'no-such-mutant'; known: "),
                          (["--backend", "nope"], "argument --backend: unknown backend 'nope'; known: "),
                          (["--catalogue", "/no/such.toml"], "argument --catalogue: cannot read"),
                          (["--shard", "4/3"], "argument --shard: --shard '4/3' must be K/N with 1 <= K <= N")):
        with pytest.raises(SystemExit) as e:
            cli.main(["mutants", *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err, argv


def test_shards_split_the_catalogue_into_disjoint_shares_that_cover_it(capsys):
    from conformance import cli

    def listed(*argv: str) -> list[str]:
        assert cli.main(["mutants", "--list", *argv]) == 0
        return [line.split()[0] for line in capsys.readouterr().out.splitlines()]

    whole = listed()
    shares = [listed("--shard", f"{k}/3") for k in (1, 2, 3)]
    assert sorted(sum(shares, [])) == sorted(whole) and all(shares)


@pytest.mark.parametrize("argv", [["mutants"], ["sanitize"], ["clones"], ["gate", "origin/main"]])
def test_commands_that_need_the_source_tree_say_so_outside_it(argv, tmp_path, monkeypatch, capsys):
    """An installed wheel has no csrc/ to rebuild and no git history: one line and exit 2."""
    from conformance import cli

    monkeypatch.setattr(mutants, "ROOT", tmp_path)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # refused while argparse checks the arguments: the usage line, then the reason
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "run it from a clone" in err and "Traceback" not in err, err


def _voters(**status: str) -> dict[str, dict[str, Any]]:
    return {b: {"status": s, "message": f"{b} {s}"} for b, s in status.items()}


def test_a_conformance_kill_names_the_faulty_backend_or_needs_a_majority():
    three = {"k": _voters(reference="pass", triton="pass", cpu="fail")}
    assert mutants.conformance_kill(three, "cpu") == (True, "cpu fail")
    assert mutants.conformance_kill(three, "triton") == (False, "")
    assert mutants.conformance_kill(three, "reference") == (False, "")  # two of three agree with the oracle
    outvoted = {"k": _voters(reference="fail", triton="pass", cpu="pass")}
    assert mutants.conformance_kill(outvoted, "reference")[0]


def test_an_oracle_fault_on_a_two_voter_kernel_is_killed_by_the_disagreement():
    # A host function (no Triton form): the port is held to the oracle; a planted oracle fault shows
    # as the port failing, and no majority can name either.
    two = {"host": _voters(reference="pass", triton="n/a", cpu="fail")}
    killed, why = mutants.conformance_kill(two, "reference")
    assert killed and "two voters" in why
    assert mutants.conformance_kill({"host": _voters(reference="pass", triton="n/a", cpu="pass")}, "reference") == (False, "")
    assert not mutants.conformance_kill(two, "triton")[0]


def test_a_backend_that_did_not_run_is_said_so_not_counted_a_survival():
    report = {"k": {"reference": {"status": "pass"}, "cpu": {"status": "skipped", "message": "the C++ extension is not built"}}}
    assert mutants.conformance_kill(report, "cpu") == (False, "could not run: the C++ extension is not built")
