"""CI gates: ``--max-bytes-per-device SIZE``, ``--max-peak-memory SIZE`` (partition and
stats) and ``--strict`` (partition). A failed gate is one line on stderr and exit code 1,
and the output file is still written; bad SIZE text is bad input (exit code 2, nothing
written). The figures are the ones ``stats`` prints (one cost model)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_spmd.errors import InputError
from hlo_spmd.ir.io import load_module
from hlo_spmd.stats import module_stats
from hlo_spmd.units import parse_size
from hlo_spmd_cli.main import _register, cli

ROOT = Path(__file__).resolve().parent.parent
CLEAN = ROOT / "fixtures" / "hlo" / "mlp_2d_megatron.pb"        # no warnings
WARNS = ROOT / "fixtures" / "hlo" / "shardy_sharding_group.pb"  # a full rematerialization

_register()


@pytest.mark.parametrize("text,expected", [
    ("123456", 123456), ("0", 0), ("1B", 1), ("1KiB", 1024), ("1.5MiB", 1572864),
    ("2GiB", 2 * 1024 ** 3), ("1TiB", 1024 ** 4), ("1KB", 1000), ("2GB", 2 * 10 ** 9),
    ("3 MB", 3 * 10 ** 6), ("1tb", 10 ** 12), ("1.5mib", 1572864), (".5KiB", 512),
    ("1.0009KB", 1000), ("12345678901234567890", 12345678901234567890),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-1", "1.5XB", "1e3", "1,5MiB", "1 K iB",
                                  "nan", "1.2.3"])
def test_parse_size_rejects(text):
    with pytest.raises(InputError, match="bad size"):
        parse_size(text)


def _figures(path: Path) -> tuple[float, int]:
    out = load_module(path)
    s = module_stats(out)
    return s.total_bytes_per_device, s.peak_live_bytes


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """The installed entry point's way in (the fast path takes plain partition lines)."""
    return subprocess.run([sys.executable, "-m", "hlo_spmd_cli", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


def _both(args: list[str]):
    """The same command line through a process (fast path for partition) and click."""
    done = _run(args)
    ran = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert done.returncode == ran.exit_code
    return done


@pytest.fixture(scope="module")
def clean_figures(tmp_path_factory) -> tuple[float, int]:
    out = tmp_path_factory.mktemp("ref") / "out.pb"
    done = _run(["partition", str(CLEAN), "-o", str(out), "-q"])
    assert done.returncode == 0, done.stderr
    moved, peak = _figures(out)
    assert moved > 0 and peak > 0  # the gates below test something
    return moved, peak


def test_partition_under_the_limits_passes(tmp_path, clean_figures):
    moved, peak = clean_figures
    out = tmp_path / "out.pb"
    done = _both(["partition", str(CLEAN), "-o", str(out), "-q", "--strict",
                  "--max-bytes-per-device", str(int(moved)), "--max-peak-memory", str(peak)])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert out.exists()


@pytest.mark.parametrize("option,figure", [("--max-bytes-per-device", "bytes per device"),
                                           ("--max-peak-memory", "peak memory")])
def test_partition_over_a_limit_fails_and_keeps_the_output(tmp_path, clean_figures, option,
                                                           figure):
    moved, peak = clean_figures
    value = int(moved) if option == "--max-bytes-per-device" else peak
    out = tmp_path / "out.pb"
    done = _both(["partition", str(CLEAN), "-o", str(out), "-q", option, str(value - 1)])
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("hlo-spmd: gate failed: " + figure)
    assert f"({value} bytes)" in lines[0] and f"({value - 1} bytes)" in lines[0]
    assert _figures(out)[0] == moved  # written, and the very module that was measured


def test_strict_turns_a_warning_into_a_failure(tmp_path):
    out = tmp_path / "out.pb"
    loose = _both(["partition", str(WARNS), "-o", str(out)])
    assert loose.returncode == 0
    assert "warning: full rematerialization" in loose.stderr
    out.unlink()
    strict = _both(["partition", str(WARNS), "-o", str(out), "-q", "--strict"])
    assert strict.returncode == 1
    lines = strict.stderr.strip().splitlines()
    assert len(lines) == 1 and "--strict: warning: full rematerialization" in lines[0]
    assert out.exists()


def test_strict_passes_a_clean_run(tmp_path):
    done = _both(["partition", str(CLEAN), "-o", str(tmp_path / "o.pb"), "-q", "--strict"])
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("bad", ["1.5XB", "-3", "lots"])
def test_bad_size_is_bad_input(tmp_path, bad):
    out = tmp_path / "out.pb"
    done = _both(["partition", str(CLEAN), "-o", str(out), "-q", "--max-peak-memory", bad])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-spmd: error: bad size")
    assert not out.exists()
    done = _both(["stats", str(CLEAN), "--max-bytes-per-device", bad])
    assert done.returncode == 2


def test_stats_gates(tmp_path, clean_figures):
    moved, peak = clean_figures
    out = tmp_path / "out.pb"
    assert _run(["partition", str(CLEAN), "-o", str(out), "-q"]).returncode == 0
    ok = _both(["stats", str(out), "--json", "--max-bytes-per-device", f"{moved / 1024}KiB",
                "--max-peak-memory", str(peak)])
    assert ok.returncode == 0, ok.stderr
    over = _both(["stats", str(out), "--max-peak-memory", str(peak - 1)])
    assert over.returncode == 1
    assert "peak live" in over.stdout  # the table is printed before the verdict
    lines = over.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-spmd: gate failed: peak memory")
