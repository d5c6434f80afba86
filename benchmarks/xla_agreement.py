"""How far our sharding completion agrees with XLA's GSPMD ``sharding-propagation``, per
fixture (the script that used to live in ``hlo_spmd.runtime.xla_reference``)::

    python benchmarks/xla_agreement.py --agreement fixtures/hlo [-v] [--xla-only]
        [--source xla-input|fixture]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

try:
    import hlo_spmd  # noqa: F401
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from hlo_spmd.passes.propagation import propagate  # noqa: E402,F401  (fail early)
from hlo_spmd.runtime.sharding_compare import AgreementReport  # noqa: E402
from hlo_spmd.runtime.xla_dumps import _first_lines  # noqa: E402
from hlo_spmd.runtime.xla_reference import (SOURCES, agreement_for_case,  # noqa: E402
                                            fixture_cases, format_agreement_table)


def _agreement_main(root: str, xla_only: bool, verbose: int, source: str) -> int:
    rows: list[tuple[str, AgreementReport | str]] = []
    for case in fixture_cases(root):
        try:
            rows.append((case.name, agreement_for_case(case, source=source,
                                                       xla_only=xla_only)))
        except Exception as exc:  # report and go on: one table for all fixtures
            rows.append((case.name, f"ERROR {type(exc).__name__}: {_first_lines(exc, 2)}"))
    print(format_agreement_table(rows))
    if verbose:
        for name, rep in rows:
            if isinstance(rep, AgreementReport) and rep.disagreements:
                print()
                print(rep.table(None if verbose > 1 else 20))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python benchmarks/xla_agreement.py",
        description="Compare our sharding completion with XLA's GSPMD sharding-propagation.")
    parser.add_argument("--agreement", metavar="DIR", required=True,
                        help="fixture directory (e.g. fixtures/hlo)")
    parser.add_argument("--xla-only", action="store_true",
                        help="compare XLA with itself (no propagation needed)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="print disagreements (-vv: all of them)")
    parser.add_argument("--source", choices=SOURCES, default="xla-input",
                        help="propagate XLA's input to sharding-propagation (default) "
                             "or the fixture as stored")
    args = parser.parse_args(argv)
    return _agreement_main(args.agreement, args.xla_only, args.verbose, args.source)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
