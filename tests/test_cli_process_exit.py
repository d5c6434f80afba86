"""The command-line process ends itself after the command (``hlo_spmd_cli.main._exit``:
exit handlers, flushed streams, ``os._exit``): exit codes, output files and messages are
those of a normal exit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hlo_spmd.ir.io import load_module

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "fixtures" / "hlo" / "mlp_2d_megatron.pb"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)  # buffered streams, as a user's shell has them
    return subprocess.run([sys.executable, "-m", "hlo_spmd_cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_success_writes_the_output_and_exits_0(tmp_path):
    out = tmp_path / "out.pb"
    done = _run("partition", str(SRC), "-o", str(out), "-n", "8")
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr  # status lines are flushed before the process ends
    assert load_module(out).entry is not None


def test_stdout_output_is_flushed(tmp_path):
    done = _run("convert", str(SRC), "-o", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HloModule ")
    assert done.stdout.rstrip().endswith("}")


def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n"
                   "  ROOT b = f32[4,4] broadcast(p), dimensions={3}\n}\n")
    out = tmp_path / "out.pb"
    done = _run("partition", str(bad), "-o", str(out), "-n", "8")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "instruction b" in lines[0] and "out of range" in lines[0]
    assert not out.exists()


def test_usage_error_exits_2():
    assert _run("partition", "--no-such-option").returncode == 2


def test_version_exits_0():
    done = _run("--version")
    assert done.returncode == 0 and "hlo-spmd" in done.stdout


def test_the_command_line_starts_numpy_with_one_blas_thread_unless_told_otherwise():
    probe = ("import os, hlo_spmd_cli.main, numpy; "
             "print(os.environ['OPENBLAS_NUM_THREADS'])")
    for given, expected in ((None, "1"), ("3", "3")):
        env = dict(os.environ)
        env.pop("OPENBLAS_NUM_THREADS", None)
        if given is not None:
            env["OPENBLAS_NUM_THREADS"] = given
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected
