"""Shared pieces of the commands: ``-`` for stdin/stdout, atomic JSON output, status
lines that ``--quiet`` silences, and a progress line for long runs. click is imported
only by the helpers that print through it (the fast path runs without it)."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

STDIO = "-"


def read_module(src: str, verify: bool = False):
    """Load ``src``; ``-`` reads stdin (proto or text, detected from the content)."""
    from hlo_spmd.ir.io import load_module, load_module_bytes, verify_with_source

    if src != STDIO:
        return load_module(src, verify=verify)
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    module = load_module_bytes(data, "<stdin>")
    if verify:
        verify_with_source(module, "<stdin>")
    return module


def write_module(module, out: str, fmt: str | None) -> None:
    """Save atomically; ``-`` writes stdout (HLO text unless ``--format proto``)."""
    from hlo_spmd.ir.io import module_bytes, module_text, save_module

    if out != STDIO:
        save_module(module, out, fmt)
        return
    import click

    data = module_bytes(module) if fmt == "proto" else module_text(module).encode("utf-8")
    stream = click.get_binary_stream("stdout")
    stream.write(data)
    stream.flush()


def write_json(obj: Any, out: str) -> None:
    """JSON, key order as built (deterministic); ``-`` is stdout; files are atomic."""
    import json  # (only the commands that write JSON load it)

    import click

    from hlo_spmd.ir.io import write_atomic

    text = json.dumps(obj, indent=1, sort_keys=False) + "\n"
    if out == STDIO:
        click.echo(text, nl=False)
    else:
        write_atomic(out, text.encode("utf-8"))


def label(path: str) -> str:
    return "<stdout>" if path == STDIO else path


def status(msg: str, quiet: bool) -> None:
    if not quiet:
        import click

        click.echo(msg, err=True)


class Progress:
    """After ``HLO_SPMD_PROGRESS_AFTER`` seconds (default 2) of one command, a line on
    stderr names the step under way, and one more each time the step changes."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.step_name = "starting"
        self.t0 = time.monotonic()
        self.shown = False
        self._last_shown: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.after = float(os.environ.get("HLO_SPMD_PROGRESS_AFTER", "2"))
        except ValueError:
            self.after = 2.0

    def __enter__(self) -> "Progress":
        if not self.quiet:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.shown and exc[0] is None:
            self._say(f"done in {time.monotonic() - self.t0:.1f} s")

    def step(self, name: str) -> None:
        with self._lock:
            self.step_name = name
        if self.shown and not self.quiet:
            self._maybe_show()

    def _say(self, text: str) -> None:
        try:
            sys.stderr.write(f"hlo-spmd: {text}\n")
            sys.stderr.flush()
        except (ValueError, OSError):  # stderr closed under us: nothing to report to
            pass

    def _maybe_show(self) -> None:
        with self._lock:
            name = self.step_name
            if name == self._last_shown:
                return
            self._last_shown = name
            self.shown = True
        self._say(f"{name} ... ({time.monotonic() - self.t0:.1f} s)")

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        self._maybe_show()


def parse_limits(max_bytes_per_device: str | None,
                 max_peak_memory: str | None) -> tuple[int | None, int | None]:
    """The gates' SIZE options in bytes (bad text: InputError, exit code 2), parsed
    before any work so a typo never costs a run."""
    from hlo_spmd.units import parse_size

    return (parse_size(max_bytes_per_device) if max_bytes_per_device is not None else None,
            parse_size(max_peak_memory) if max_peak_memory is not None else None)


def check_gates(stats, max_bytes_per_device: int | None, max_peak_memory: int | None,
                warnings: list[str] = (), strict: bool = False) -> None:
    """Raise GateError (exit code 1, one line) naming every figure over its limit and,
    with ``strict``, the first of the run's warnings and how many there were."""
    from hlo_spmd.errors import GateError
    from hlo_spmd.stats import gate_failures

    failures = gate_failures(stats, max_bytes_per_device=max_bytes_per_device,
                             max_peak_memory=max_peak_memory) if stats is not None else []
    if strict and warnings:
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        failures.append(f"--strict: warning: {warnings[0]}{more}")
    if failures:
        raise GateError("; ".join(failures))
