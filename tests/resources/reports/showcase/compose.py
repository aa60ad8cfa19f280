"""Joins two real runs into the showcase report (see ../README.md).

``python compose.py PLAIN.xml MUTANTS.xml OUT.xml``: every testcase of ``PLAIN.xml`` plus
the ``...!mutant=...`` testcases of ``MUTANTS.xml``, one testsuite per target.
"""

from __future__ import annotations

import sys

from junitparser import JUnitXml, TestSuite


def main(plain: str, mutants: str, out: str) -> None:
    suites: dict[str, TestSuite] = {s.name: s for s in JUnitXml.fromfile(plain)}
    for suite in JUnitXml.fromfile(mutants):
        for case in suite:
            if "!mutant=" in case.name:
                suites.setdefault(suite.name, TestSuite(suite.name)).add_testcase(case)
    xml = JUnitXml("cpmatrix")
    for name in sorted(suites):
        suites[name].update_statistics()
        xml.add_testsuite(suites[name])
    xml.update_statistics()
    xml.write(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
