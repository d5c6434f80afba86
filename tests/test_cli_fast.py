"""The command line's fast path (hlo_spmd_cli.fast): it knows every option of the click
partition command, parses what it takes exactly as click does, leaves everything else to
click, and runs without importing click; a process run through it writes the same file
and exits as the click command does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_spmd_cli.fast import DEFAULTS, OPTIONS, parse_partition
from hlo_spmd_cli.main import _register, cli

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "fixtures" / "hlo" / "mlp_2d_megatron.pb"

_register()
PARTITION = cli.commands["partition"]


def _click_params(args: list[str]) -> dict:
    ctx = PARTITION.make_context("partition", list(args))
    return dict(ctx.params)


def test_the_table_is_the_click_commands_parameters():
    params = {p.name: p for p in PARTITION.params}
    assert set(params) == set(DEFAULTS)
    # Every default as click gives it when the option is absent (IN and -o are required).
    given = _click_params(["in.pb", "-o", "out.pb"])
    assert {**DEFAULTS, "src": "in.pb", "out": "out.pb"} == given
    spellings = {opt: p.name for p in PARTITION.params if p.param_type_name == "option"
                 for opt in p.opts}
    assert spellings == {opt: name for opt, (name, _) in OPTIONS.items()}
    for opt, (name, convert) in OPTIONS.items():
        assert (convert is None) == params[name].is_flag, opt
        assert (name == "shards") == params[name].multiple, opt


@pytest.mark.parametrize("args", [
    ["in.pb", "-o", "out.pb"],
    ["in.pb", "-o", "out.pb", "-n", "8", "-q"],
    ["-q", "--output=out.hlo", "in.pb", "--num-partitions", "08"],
    ["in.pb", "-o", "o.pb", "--complete", "--bidirectional", "--format", "text",
     "--report", "r.json", "--windowed-einsum-threshold", "0.5",
     "--combine-threshold=.25", "--mesh", "data=2,model=4", "--shard", "#0=data,_",
     "--shard=out=_,model", "--quiet"],
    ["in.pb", "-o", "", "--mesh="],
    ["in.pb", "-o", "o.pb", "--combine-threshold", "0", "--windowed-einsum-threshold", "12."],
])
def test_what_it_takes_it_parses_as_click(args):
    got = parse_partition(args)
    assert got is not None
    assert got == _click_params(args)


@pytest.mark.parametrize("args", [
    [], ["in.pb"], ["-o", "out.pb"],                      # click reports what is missing
    ["in.pb", "-o", "a.pb", "-o", "b.pb"],                 # repeated: click's rule
    ["in.pb", "other.pb", "-o", "a.pb"],                   # an extra argument
    ["-", "-o", "a.pb"], ["in.pb", "-o", "-"],             # stdin / stdout
    ["in.pb", "-o", "a.pb", "--report", "-"],
    ["in.pb", "-oa.pb"], ["in.pb", "-qo", "a.pb"],         # short forms
    ["in.pb", "-o", "a.pb", "--help"], ["in.pb", "-o", "a.pb", "-h"],
    ["in.pb", "-o", "a.pb", "--no-such-option"],
    ["in.pb", "-o", "a.pb", "--", "x"],
    ["in.pb", "-o", "a.pb", "-n", "-3"], ["in.pb", "-o", "a.pb", "-n", "8.0"],
    ["in.pb", "-o", "a.pb", "-n", " 8"], ["in.pb", "-o", "a.pb", "-n"],
    ["in.pb", "-o", "a.pb", "--combine-threshold", "1e3"],
    ["in.pb", "-o", "a.pb", "--combine-threshold", "-1"],
    ["in.pb", "-o", "a.pb", "--combine-threshold", "nan"],
    ["in.pb", "-o", "a.pb", "--format", "TEXT"],
    ["in.pb", "-o", "a.pb", "--quiet=1"], ["in.pb", "-o", "a.pb", "-q", "-q"],
    ["in.pb", "-o", "a.pb", "--mesh", "--complete"],
])
def test_everything_else_is_left_to_click(args):
    assert parse_partition(args) is None


def _process(args: list[str], probe: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    if probe:  # run the fast path in a process and say whether click was imported
        code = ("import sys; from hlo_spmd_cli.fast import run_fast; "
                f"code = run_fast({args!r}); print(code, 'click' in sys.modules)")
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "hlo_spmd_cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_a_quiet_run_does_not_import_click(tmp_path):
    out = tmp_path / "out.pb"
    done = _process(["partition", str(SRC), "-o", str(out), "-n", "8", "-q"], probe=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]
    assert out.exists()


@pytest.mark.parametrize("extra", [["-q"], [], ["--report", "REPORT", "-q"],
                                   ["--format", "text"]])
def test_the_process_writes_what_the_click_command_writes(tmp_path, extra, monkeypatch):
    # Progress lines depend on how long a run takes (a loaded machine crosses the 2 s
    # mark): this test compares the status lines, so neither run prints progress.
    monkeypatch.setenv("HLO_SPMD_PROGRESS_AFTER", "1e9")
    fast_out, click_out = tmp_path / "fast.pb", tmp_path / "click.pb"
    fast_extra = [str(tmp_path / "fast.json") if a == "REPORT" else a for a in extra]
    click_extra = [str(tmp_path / "click.json") if a == "REPORT" else a for a in extra]
    done = _process(["partition", str(SRC), "-o", str(fast_out), "-n", "8", *fast_extra])
    ran = CliRunner().invoke(cli, ["partition", str(SRC), "-o", str(click_out), "-n", "8",
                                   *click_extra], catch_exceptions=False)
    assert done.returncode == ran.exit_code == 0, done.stderr
    assert fast_out.read_bytes() == click_out.read_bytes()
    assert done.stderr == ran.stderr.replace(str(click_out), str(fast_out))
    if "REPORT" in extra:
        fast_json = (tmp_path / "fast.json").read_text()
        click_json = (tmp_path / "click.json").read_text()
        assert fast_json == click_json


def test_bad_input_is_one_line_exit_2_and_no_output_through_the_fast_path(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n"
                   "  ROOT b = f32[4,4] broadcast(p), dimensions={3}\n}\n")
    out = tmp_path / "out.pb"
    args = ["partition", str(bad), "-o", str(out), "-n", "8", "-q"]
    done = _process(args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-spmd: error: ")
    assert "instruction b" in lines[0]
    assert not out.exists()
    ran = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert ran.exit_code == 2 and ran.stderr == done.stderr
    probe = _process(args, probe=True)
    assert probe.stdout.split()[0] == "2"


def test_a_missing_file_is_exit_2_as_with_click(tmp_path):
    args = ["partition", str(tmp_path / "none.pb"), "-o", str(tmp_path / "o.pb"), "-q"]
    done = _process(args)
    ran = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert done.returncode == ran.exit_code == 2
    assert done.stderr == ran.stderr
