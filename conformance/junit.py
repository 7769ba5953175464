"""JUnit XML for CI systems: one ``<testsuite>`` per file, one ``<testcase>`` per check."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TestCase:
    classname: str
    name: str
    seconds: float = 0.0
    failure: str | None = None  # the message CI shows; None when the check passed
    error: str | None = None
    skipped: str | None = None


def write(path: str | os.PathLike[str], suite: str, cases: list[TestCase]) -> Path:
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(sum(c.failure is not None for c in cases)),
        errors=str(sum(c.error is not None for c in cases)),
        skipped=str(sum(c.skipped is not None for c in cases)),
        time=f"{sum(c.seconds for c in cases):.3f}",
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    for c in cases:
        e = ET.SubElement(root, "testcase", classname=c.classname, name=c.name, time=f"{c.seconds:.3f}")
        for tag, text in (("failure", c.failure), ("error", c.error), ("skipped", c.skipped)):
            if text is not None:
                ET.SubElement(e, tag, message=text.splitlines()[0][:200] if text else "").text = text
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return out
