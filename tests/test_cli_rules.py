"""`hlo-spmd rules [OPCODE]`: the opcode / custom-call target -> completion rules and
partition handler map, generated from the registries."""
from __future__ import annotations

import importlib
import json

from click.testing import CliRunner

from hlo_spmd.ir.opcodes import ALL_OPCODES
from hlo_spmd.passes.partition.handlers import handler_tables
from hlo_spmd_cli.main import _register, cli

_register()


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _rows(*args: str) -> list[dict]:
    r = run("rules", "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_every_opcode_and_target_has_a_row_whose_handler_resolves():
    rows = _rows()
    by_opcode, by_target = handler_tables()
    opcodes = {r["name"] for r in rows if r["kind"] == "opcode"}
    targets = {r["name"] for r in rows if r["kind"] == "custom-call"}
    assert opcodes == set(ALL_OPCODES)
    assert set(by_target) <= targets
    for r in rows:
        assert r["forward"] and r["backward"], r
        fn_name = r["handler_function"].split(" ")[0]
        fn = getattr(importlib.import_module(r["handler_module"]), fn_name)
        registered = (by_opcode if r["kind"] == "opcode" else by_target).get(r["name"])
        if registered is not None:
            assert fn is registered, r


def test_an_opcode_without_handler_prints_why():
    (row,) = _rows("fft")
    assert row["handler_module"] == "hlo_spmd.passes.partition.handlers.basic"
    assert row["handler_function"].startswith("handle_replicated (no handler: ")


def test_one_opcode():
    rows = _rows("dot")
    assert rows == [{"kind": "opcode", "name": "dot", "forward": "dot",
                     "backward": "dot (level>=1)",
                     "handler_module": "hlo_spmd.passes.partition.handlers.dot",
                     "handler_function": "handle_dot"}]
    r = run("rules", "while")
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0].split() == ["kind", "name", "forward", "backward", "handler"]
    assert len(lines) == 2 and "control_flow.handle_while" in lines[1]


def test_custom_call_target():
    (row,) = _rows("SPMDFullToShardShape")
    assert row["kind"] == "custom-call" and row["handler_function"] == "_full_to_shard"


def test_unknown_name_is_one_line_exit_2():
    r = CliRunner().invoke(cli, ["rules", "no-such-op"])
    assert r.exit_code == 2
    assert "no-such-op" in r.output and len(r.output.strip().splitlines()) == 1
