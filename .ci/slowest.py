"""The slowest tests of a CI run: ``python .ci/slowest.py DIR [N]`` reads every JUnit XML file that the Makefile's
pytest runs wrote into DIR (``PYTEST_REPORT_DIR``) and prints the N (15) longest tests, setup and teardown included
(pytest's ``junit_duration_report=total``: a module-scoped fixture is charged to the first test that uses it)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(report_dir: Path) -> list[tuple[float, str, str]]:
    """(seconds, run, test id) of every test case in ``report_dir/*.xml``; the run is the file's stem."""
    found = []
    for xml in sorted(report_dir.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError as e:  # a run killed while writing: say so, keep the others
            print(f"{xml}: unreadable ({e})", file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"  # e.g. tests.hpo.test_x::test_y
            found.append((float(case.get("time") or 0), xml.stem, test))
    return found


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    report_dir, n = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 15
    found = cases(report_dir)
    if not found:
        print(f"slowest tests: no JUnit XML test cases in {report_dir}")
        return 0
    runs: dict[str, list[float]] = {}
    for seconds, run, _ in found:
        runs.setdefault(run, []).append(seconds)
    for run, times in runs.items():  # the two runs of make test-slow go side by side: the longer one sets its time
        print(f"{run}: {len(times)} tests, {sum(times):.0f} s of test time")
    print(f"{'seconds':>8}  {'run':<10}  test (the {min(n, len(found))} slowest of {len(found)})")
    for seconds, run, test in sorted(found, reverse=True)[:n]:
        print(f"{seconds:8.1f}  {run:<10}  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
