"""The hlo-spmd command line: the process entry point (thin click commands over the
library, :mod:`hlo_spmd_cli.app` and :mod:`hlo_spmd_cli.commands`; the common
``partition FILE -o FILE`` form runs without click, :mod:`hlo_spmd_cli.fast`).

Every user-facing failure is one line on stderr and exit code 2; no traceback, no
partial output file (the library writes atomically). A failed CI gate
(``--max-bytes-per-device``, ``--max-peak-memory``, ``--strict``) is one line and exit
code 1, after the output was written.
"""
from __future__ import annotations

import gc
import os
import sys

# The partitioner's numpy work is small integer device tables, never BLAS. One BLAS
# thread spares every run OpenBLAS's start of a worker thread per core at numpy's
# import (about 0.1 s of CPU for a short run, measured). A user's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# (nothing may import numpy before that setting: click and the library come after it)

EXIT_GATE_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3


def error_exit_code(e: BaseException) -> int | None:
    """Say what went wrong in one line on stderr and give the exit code: 1 for a failed
    CI gate (``GateError``), 2 for a problem with the input (``HloSpmdError``), 130 for an interrupt, 3 for a bug (its traceback
    only with ``HLO_SPMD_DEBUG``: then None, and the caller re-raises). One policy for
    commands run through click (:mod:`hlo_spmd_cli.app`) and the fast path."""
    import click  # (the message is printed as every other line: click.echo)

    from hlo_spmd.errors import GateError, HloSpmdError

    if isinstance(e, GateError):  # the output was written; a CI gate says no
        click.echo(f"hlo-spmd: gate failed: {e}", err=True)
        return EXIT_GATE_FAILED
    if isinstance(e, HloSpmdError):
        click.echo(f"hlo-spmd: error: {e}", err=True)
        return EXIT_USER_ERROR
    if isinstance(e, KeyboardInterrupt):
        click.echo("hlo-spmd: interrupted", err=True)
        return 130
    if not isinstance(e, Exception) or os.environ.get("HLO_SPMD_DEBUG"):
        return None
    # a bug: say so in one line; traceback only on request
    click.echo(f"hlo-spmd: internal error ({type(e).__name__}): {e} "
               "[set HLO_SPMD_DEBUG=1 for a traceback]", err=True)
    return EXIT_INTERNAL_ERROR


def __getattr__(name: str):
    # ``cli`` (the click group) lives in hlo_spmd_cli.app, imported on first use: a
    # command line the fast path runs never imports click (~70M instructions, a
    # quarter of the interpreter's own start-up).
    if name in ("cli", "_Group"):
        from hlo_spmd_cli import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register() -> None:
    from hlo_spmd_cli import commands  # noqa: F401  (commands attach themselves to `cli`)


# The process builds one large, long-lived object graph (the module, its protos, the
# partitioned copy) and frees little, and what it frees goes by reference counting: the
# cyclic collector only rescans live objects. With Python's default thresholds that was
# 14 full collections (~4 s of a ~40 s run) on a 100k-instruction module; with young
# collections every 50k allocations, still ~13 ms per young collection (0.1 s at 14k
# instructions). Measured with the collector off: the same peak RSS at 14k and at 100k
# instructions (163 MB, 807 MB), so the command runs without it (the process ends with
# os._exit, which frees nothing either).
def main() -> None:
    """The process entry point (console script, ``python -m hlo_spmd_cli``): runs the
    command, then ends the process without tearing the object graph down."""
    gc.disable()
    from hlo_spmd_cli.fast import run_fast

    code = run_fast(sys.argv[1:])
    if code is None:  # not a command line the fast path takes: click parses it
        _register()
        from hlo_spmd_cli.app import cli

        try:
            cli.main(prog_name="hlo-spmd")
            code = 0
        except SystemExit as e:  # click ends every command this way
            code = e.code
    _exit(code)


def _exit(code) -> None:
    """``sys.exit(code)`` for a process whose work is done: every output file is written
    and closed (saves are atomic renames), so freeing the module's object graph one
    object at a time at interpreter shutdown only costs time (~0.1 s at 3.6k
    instructions, seconds at 100k). Exit handlers still run and the standard streams
    are flushed; then ``os._exit``. Exit codes are those of ``sys.exit``."""
    import atexit

    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: as Python's own shutdown
            code = code or 120
    os._exit(code)

