"""The command line's fast path: ``hlo-spmd partition IN -o OUT [options]`` without
importing click (click's import is ~70M instructions, more than the rest of the
command line's own work; a 3.6k-instruction partition run is ~2,700M in all).

This is not a second command-line parser with its own rules: it takes only the plain
spellings of the partition command's options whose values it can convert exactly as
click does, and hands every other command line to click untouched (``run_fast`` returns
None, before anything has run): other commands, help, ``--version``, ``--``, an unknown
or repeated option, ``-ovalue`` / ``-qn`` short forms, a value click would convert
differently or reject, stdin / stdout (``-``), a missing ``-o``. So every usage error
and every help text is click's. Once parsed, the command is the one function the click
command runs (:func:`hlo_spmd_cli.partition_run.run_partition`), and a failure is
reported by the same policy (:func:`hlo_spmd_cli.main.error_exit_code`).
``tests/test_cli_fast.py`` holds the table to the click command's parameters and the
parsed values to click's.
"""
from __future__ import annotations

import re
from typing import Any, Callable

# click's parameter name -> its default, for every parameter of ``commands.partition``.
DEFAULTS: dict[str, Any] = {
    "src": None, "out": None, "num_partitions": None, "complete": False, "fmt": None,
    "report_path": None, "windowed_mib": None, "bidirectional": False, "combine_mib": 30.0,
    "mesh": None, "shards": (), "quiet": False, "max_bytes_per_device": None,
    "max_peak_memory": None, "strict": False, "propagate_to_output": None,
    "propagate_to_params": None,
}

_UINT = re.compile(r"[0-9]+")
# A non-negative decimal: float() of it is click's FloatRange(min=0) value.
_UFLOAT = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def _int(value: str) -> int | None:
    return int(value) if _UINT.fullmatch(value) else None


def _float(value: str) -> float | None:
    return float(value) if _UFLOAT.fullmatch(value) else None


def _choice(*allowed: str) -> Callable[[str], str | None]:
    return lambda value: value if value in allowed else None


def _path(value: str) -> str | None:
    # '-' is stdin / stdout: click's path, which handles its streams' errors.
    return None if value == "-" else value


def _text(value: str) -> str:
    return value


# Option spelling -> (parameter name, converter; None for a flag). The converter returns
# None for a value the fast path leaves to click.
OPTIONS: dict[str, tuple[str, Callable[[str], Any] | None]] = {
    "-o": ("out", _path), "--output": ("out", _path),
    "-n": ("num_partitions", _int), "--num-partitions": ("num_partitions", _int),
    "--complete": ("complete", None),
    "--format": ("fmt", _choice("text", "proto")),
    "--report": ("report_path", _path),
    "--windowed-einsum-threshold": ("windowed_mib", _float),
    "--bidirectional": ("bidirectional", None),
    "--combine-threshold": ("combine_mib", _float),
    "--mesh": ("mesh", _text),
    "--shard": ("shards", _text),
    "-q": ("quiet", None), "--quiet": ("quiet", None),
    # SIZE text is parsed by run_partition (hlo_spmd.units.parse_size), as under click.
    "--max-bytes-per-device": ("max_bytes_per_device", _text),
    "--max-peak-memory": ("max_peak_memory", _text),
    "--strict": ("strict", None),
    "--propagate-to-output": ("propagate_to_output", _text),
    "--propagate-to-params": ("propagate_to_params", _text),
}
_MULTIPLE = frozenset({"shards"})
# Options whose value is optional (click's flag_value): alone they mean this value.
_OPTIONAL_VALUE = {"propagate_to_output": "all", "propagate_to_params": "all"}


def parse_partition(args: list[str]) -> dict[str, Any] | None:
    """The partition command's parameters from ``args`` (after ``partition``), exactly as
    click would give them; None when the command line is not one the fast path takes."""
    params: dict[str, Any] = {}
    shards: list[str] = []
    i, n = 0, len(args)
    while i < n:
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            if "src" in params or arg == "-":
                return None
            params["src"] = arg
            continue
        value = None
        if arg.startswith("--") and "=" in arg:
            arg, value = arg.split("=", 1)
        spec = OPTIONS.get(arg)
        if spec is None:
            return None
        name, convert = spec
        if convert is None:  # a flag
            if value is not None or name in params:
                return None
            params[name] = True
            continue
        if value is None and name in _OPTIONAL_VALUE:
            if i < n and not args[i].startswith("-"):
                return None  # click would take the next word as the value: click decides
            value = _OPTIONAL_VALUE[name]
        if value is None:
            if i == n or args[i].startswith("-"):
                return None  # no value, or one click reads differently: click decides
            value = args[i]
            i += 1
        converted = convert(value)
        if converted is None:
            return None
        if name in _MULTIPLE:
            shards.append(converted)
        elif name in params:
            return None
        else:
            params[name] = converted
    if "src" not in params or "out" not in params:
        return None
    if shards:
        params["shards"] = tuple(shards)
    return {**DEFAULTS, **params}


def run_fast(argv: list[str]) -> int | None:
    """Run ``argv`` (the process's arguments after the program name) when it is a
    command line the fast path takes: its exit code. Else None, having done nothing."""
    if not argv or argv[0] != "partition":
        return None
    params = parse_partition(argv[1:])
    if params is None:
        return None
    from hlo_spmd_cli.partition_run import run_partition

    try:
        run_partition(**params)
    except (Exception, KeyboardInterrupt) as e:
        from hlo_spmd_cli.main import error_exit_code

        code = error_exit_code(e)
        if code is None:
            raise
        return code
    return 0
