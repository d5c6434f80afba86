"""Fuzzing the CLI with mutated fixtures: every case ends in a complete output file or a
one-line error with exit code 2; never a traceback, an internal error or a partial file.

Runs in-process through click's runner (one process, a few hundred cases); the deep run
(thousands) is under the `slow` marker (`make test-slow`). The seed of a failing case is
in its message: `FUZZ_SEED=<seed> pytest tests/test_cli_fuzz.py` replays it."""
from __future__ import annotations

import os
import random

import pytest
from click.testing import CliRunner

from _fuzz import mutate_proto, mutate_proto_fields, mutate_text
from hlo_spmd_cli.main import _register, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")
# Small fixtures keep a case fast; together they cover dots, reduces, loops, branches,
# Shardy attributes, manual regions, uneven shapes, slicing and the fallback.
SEEDS = ["mlp_2d_megatron", "mlp_dp", "while_loop", "conditional", "cumsum", "dot_variants",
         "shardy_mlp_2d", "shard_map_partial_manual", "uneven_shapes", "gather_scatter",
         "sort_topk", "elementwise_broadcast_reduce"]

_register()


def _inputs():
    out = []
    for name in SEEDS:
        with open(os.path.join(FIX, f"{name}.pb"), "rb") as f:
            pb = f.read()
        with open(os.path.join(FIX, f"{name}.hlo")) as f:
            text = f.read()
        out.append((name, pb, text))
    return out


OTHER_COMMANDS = [
    lambda src, out: ["convert", src, "-o", out, "-q"],
    lambda src, out: ["propagate", src, "-o", out, "-q"],
    lambda src, out: ["show", src, "-a"],
    lambda src, out: ["stats", src, "--json"],
    lambda src, out: ["explain", src, "dot_general.1", "--json"],
    lambda src, out: ["verify", src, src],  # not a per-device program: refused by name
]


def check_case(tmp_path, data: bytes, suffix: str, what: str, command=None) -> None:
    src = tmp_path / f"in{suffix}"
    src.write_bytes(data)
    out = tmp_path / "out.pb"
    if out.exists():
        out.unlink()
    args = (command(str(src), str(out)) if command is not None
            else ["partition", str(src), "-o", str(out), "-q"])
    writes = "-o" in args
    r = CliRunner().invoke(cli, args)
    err = r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"{what}: exception {r.exception!r}"
    assert r.exit_code in (0, 2), f"{what}: exit {r.exit_code}: {err.strip()}"
    assert "Traceback" not in err and "internal error" not in err, f"{what}: {err}"
    if r.exit_code == 0:
        if writes:
            from hlo_spmd.ir.io import load_module

            load_module(out, verify=True)  # complete and valid
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hlo-spmd: error: "), f"{what}: {err}"
        assert not out.exists(), f"{what}: partial output"
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith(".out.pb.")]
    assert not leftovers, f"{what}: temporary files left: {leftovers}"


def run_fuzz(tmp_path, cases: int, seed0: int) -> None:
    inputs = _inputs()
    only = os.environ.get("FUZZ_SEED")
    seeds = [int(only)] if only else range(seed0, seed0 + cases)
    for seed in seeds:
        rng = random.Random(seed)
        name, pb, text = rng.choice(inputs)
        _, opb, otext = rng.choice(inputs)
        r = rng.random()
        if r < 0.2:
            data, suffix = mutate_proto(pb, opb, rng), ".pb"
            if rng.random() < 0.3:
                data = mutate_proto(data, opb, rng)
        elif r < 0.5:
            data, suffix = mutate_proto_fields(pb, rng), ".pb"
            if rng.random() < 0.3:
                data = mutate_proto_fields(data, rng)
        else:
            t = mutate_text(text, otext, rng)
            if rng.random() < 0.3:
                t = mutate_text(t, otext, rng)
            data, suffix = t.encode("utf-8", "surrogatepass"), ".hlo"
        check_case(tmp_path, data, suffix, f"seed {seed} ({name}{suffix})")
        if rng.random() < 0.25:
            k = rng.randrange(len(OTHER_COMMANDS))
            check_case(tmp_path, data, suffix, f"seed {seed} ({name}{suffix}, command {k})",
                       OTHER_COMMANDS[k])


def test_fuzz_partition(tmp_path):
    run_fuzz(tmp_path, 300, 0)


@pytest.mark.slow
def test_fuzz_partition_deep(tmp_path):
    run_fuzz(tmp_path, 3000, 100_000)


def _random_spec(rng: random.Random) -> str:
    atoms = ["data", "model", "_", "x", "data+model", "model+data", "", "+", "_,_", "1",
             "data,", ",", "#", "=", " data "]
    return ",".join(rng.choice(atoms) for _ in range(rng.randint(0, 3)))


def test_fuzz_mesh_and_shard_specs(tmp_path):
    """Random --mesh / --shard values: a complete output or a one-line error, exit 2."""
    rng = random.Random(7)
    src = os.path.join(FIX, "mlp_dp.pb")
    targets = ["#0", "#1", "#2", "#9", "out", "out#0", "x.1", "dot_general.1", "nope", "",
               "#-1", "out#x"]
    meshes = ["data=8", "data=2,model=4", "model=4,data=2", "data=0", "data=x", "=8",
              "data=8,data=1", "data=2", "data=1,model=8", "data=8,", " data = 8 "]
    for case in range(200):
        args = ["partition", src, "-o", str(tmp_path / "out.pb"), "-q"]
        if rng.random() < 0.9:
            args += ["--mesh", rng.choice(meshes)]
        for _ in range(rng.randint(0, 3)):
            args += ["--shard", f"{rng.choice(targets)}={_random_spec(rng)}"]
        out = tmp_path / "out.pb"
        if out.exists():
            out.unlink()
        r = CliRunner().invoke(cli, args)
        what = f"case {case}: {args[5:]}"
        assert r.exit_code in (0, 2), f"{what}: exit {r.exit_code} {r.stderr}"
        if r.exit_code == 2:
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("hlo-spmd: error: "), f"{what}: {r.stderr}"
            assert not out.exists(), what
        else:
            assert out.exists(), what
