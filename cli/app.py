"""The click application: the ``hlo-spmd`` group, which turns library errors into
one-line messages and exit codes (the commands attach themselves to it in
:mod:`hlo_spmd_cli.commands`). Imported only when a command line needs click (see
:mod:`hlo_spmd_cli.fast`)."""
from __future__ import annotations

import click

from hlo_spmd import __version__
from hlo_spmd_cli.main import error_exit_code


class _Group(click.Group):
    """Turns library errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except (Exception, KeyboardInterrupt) as e:
            code = error_exit_code(e)
            if code is None:
                raise
            ctx.exit(code)

    def main(self, *args, **kwargs):
        # Usage errors print click's usage block; keep them to exit code 2 as well.
        return super().main(*args, **kwargs)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hlo-spmd")
def cli() -> None:
    """hlo-spmd: a standalone SPMD partitioner for XLA HLO modules."""
