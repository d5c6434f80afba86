"""The hlo-spmd command line: thin click commands over the library.

Every user-facing failure is one line on stderr and exit code 2; no traceback, no
partial output file (the library writes atomically).
"""
from __future__ import annotations

import gc
import os

# The partitioner's numpy work is small integer device tables, never BLAS. One BLAS
# thread spares every run OpenBLAS's start of a worker thread per core at numpy's
# import (about 0.1 s of CPU for a short run, measured). A user's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # (after the BLAS setting: nothing may import numpy before it)

from hlo_spmd import __version__
from hlo_spmd.errors import HloSpmdError

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3


class _Group(click.Group):
    """Turns library errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except HloSpmdError as e:
            click.echo(f"hlo-spmd: error: {e}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("hlo-spmd: interrupted", err=True)
            ctx.exit(130)
        except Exception as e:  # a bug: say so in one line; traceback only on request
            if os.environ.get("HLO_SPMD_DEBUG"):
                raise
            click.echo(f"hlo-spmd: internal error ({type(e).__name__}): {e} "
                       "[set HLO_SPMD_DEBUG=1 for a traceback]", err=True)
            ctx.exit(EXIT_INTERNAL_ERROR)

    def main(self, *args, **kwargs):
        # Usage errors print click's usage block; keep them to exit code 2 as well.
        return super().main(*args, **kwargs)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hlo-spmd")
def cli() -> None:
    """hlo-spmd: a standalone SPMD partitioner for XLA HLO modules."""


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
    _register()
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
    import sys

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

