"""The engine check over several vLLM releases: one run per release, then one table.

``python -m conformance run --releases 0.20.0,0.30.0,0.32.0,0.33.0 [run options]`` runs the engine
check once per release, each in a process of its own (``--vllm RELEASE``, its report under
``reports/engine-<release>.json``), then prints kernel x release x engine backend, so that a maintainer
sees when each defect came and went. A cell reads ``pass``, ``drift`` (the release's parameters, as
the contract declares them for it), ``fail`` with the expected.toml ids of its findings (``new`` for a
finding nothing lists), ``unsupported``, ``missing`` (the release has no such kernel) or ``-`` (the
backend did not load). The exit status is the worst of the runs'.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ENGINE_BACKENDS = ("vllm", "vllm-cpu")


def cell(report: dict[str, Any], kernel: str, backend: str) -> str:
    """What one release's report says of one kernel on one engine backend."""
    entry = report.get("kernels", {}).get(kernel, {}).get(backend)
    if entry is None:
        return "-"
    found = [f for f in report.get("findings", []) if f["kernel"] == kernel and f["backend"] == backend]
    failing = [f for f in found if f["status"] == "fail"]
    if failing:
        ids = sorted({f["expected"] or "new" for f in failing})
        kinds = sorted({f["kind"] for f in failing if f["kind"] in ("signature", "error")})
        return "fail " + ",".join(ids) + (f" ({','.join(kinds)})" if kinds else "")
    if any(f["status"] == "drift" for f in found):
        return "drift"
    status = entry.get("status", "-")
    if status == "skipped":
        return "missing" if " has no " in (entry.get("message") or "") else "-"
    return status


def table(reports: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Rows of kernel, then one cell per release and engine backend."""
    kernels: list[str] = []
    for r in reports.values():
        kernels += [k for k in r.get("kernels", {}) if k not in kernels]
    return [[k, *(cell(reports[rel], k, b) for rel in reports for b in ENGINE_BACKENDS)] for k in kernels]


def render(reports: dict[str, dict[str, Any]]) -> str:
    header = ["kernel", *(f"{rel} {b}" for rel in reports for b in ENGINE_BACKENDS)]
    rows = [header, *table(reports)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def run(releases: list[str], rest: list[str], out_dir: Path) -> int:
    """Runs the engine check on each release (``rest``: the other run options) and prints the table."""
    reports: dict[str, dict[str, Any]] = {}
    worst = 0
    for release in releases:
        path = out_dir / f"engine-{release}.json"
        print(f"\n=== vLLM {release} ===", flush=True)
        rc = subprocess.run([sys.executable, "-m", "conformance", "run", "--vllm", release, "--report", str(path), *rest]).returncode
        worst = max(worst, rc)
        try:
            reports[release] = json.loads(path.read_text())
        except (OSError, ValueError):
            print(f"releases: vLLM {release} wrote no report (exit {rc})", file=sys.stderr)
    print("\nkernel x release x engine backend:\n" + render(reports))
    (out_dir / "engine-releases.json").write_text(json.dumps(
        {"releases": list(reports), "backends": list(ENGINE_BACKENDS), "rows": table(reports)}, indent=1))
    return worst
