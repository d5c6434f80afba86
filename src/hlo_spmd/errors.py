"""Error types shared by the library.

The CLI turns every ``HloSpmdError`` into a one-line message and exit code 2;
anything else escaping the library is an internal error (a bug).
"""
from __future__ import annotations


class HloSpmdError(Exception):
    """Base class: a problem with the user's input or request, not a bug."""

    def __init__(self, message: str, where: str | None = None) -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class GateError(HloSpmdError):
    """A CI gate failed: a figure of the output exceeds its limit, or (strict) the run
    warned. Not bad input: the command line exits 1 for it, after writing its output."""


class InputError(HloSpmdError):
    """The input file cannot be read or decoded (missing, corrupt, unknown format)."""


class ParseError(InputError):
    """HLO text syntax error; ``where`` is ``file:line:column``."""

    def __init__(self, message: str, line: int, column: int, source: str = "<text>") -> None:
        self.line = line
        self.column = column
        super().__init__(message, f"{source}:{line}:{column}")


class ShardingError(HloSpmdError):
    """A sharding is invalid or contradicts the shape / device count it is used with."""


class VerifierError(HloSpmdError):
    """The module is structurally inconsistent (shapes, names, ids, called computations)."""


class PartitionError(HloSpmdError):
    """An internal partitioning failure; names the instruction it happened on."""
