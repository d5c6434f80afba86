"""Sanity checks for the HLO fixtures in fixtures/hlo (generated + handwritten).

Uses only jaxlib's HLO parser/printer as the oracle; nothing is compiled or run.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jaxlib")
_hlo = pytest.importorskip("jaxlib._hlo")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
GEN_DIR = FIXTURES / "hlo"
HW_DIR = GEN_DIR / "handwritten"

GENERATED = sorted(GEN_DIR.glob("*.json"))
HANDWRITTEN = sorted(HW_DIR.glob("*.json"))
ALL = GENERATED + HANDWRITTEN

REQUIRED_KEYS = {
    "name": str, "description": str, "num_partitions": int, "mesh": dict,
    "inputs": list, "outputs": list, "main_ops": list, "form": str,
    "partition_counts": list, "generator": str,
}
DTYPES = {"float32": "f32", "int32": "s32", "bool": "pred", "bfloat16": "bf16",
          "float16": "f16", "int64": "s64", "uint32": "u32", "float64": "f64"}
VALUE_RE = re.compile(r"^(normal(:[0-9.]+)?|uniform|ones|zeros|int_range:-?\d+:-?\d+)$")

EXPECTED_GENERATED = {
    "mlp_dp", "mlp_dp_2", "mlp_dp_4", "mlp_2d_megatron", "transformer_layer_fwd",
    "transformer_train_step", "moe_einsum", "conv_spatial", "conv_strided_pool",
    "pipeline_shift", "uneven_shapes", "gather_scatter", "sort_topk", "cumsum",
    "while_loop", "conditional", "elementwise_broadcast_reduce", "dot_variants",
    "shardy_mlp_2d", "shardy_transformer_layer_fwd", "shardy_uneven",
    "shard_map_partial_manual",
    "cnn_train_step", "cnn_train_step_4", "cnn_train_step_2", "conv_dilated",
    "conv_transposed", "conv_depthwise", "pooling_grad",
    "embedding_vocab_sharded", "embedding_vocab_sharded_4", "gpt_train_step_tied",
    "moe_gather_scatter", "argmax_sort_sharded", "topk_sharded", "take_along_axis",
    "grouped_conv_train_step", "grouped_conv_train_step_spatial",
    "moe_router_topk",
}
EXPECTED_HANDWRITTEN = {
    "row_sharded_matmul", "elementwise_sharding_custom_call", "while_tuple_carry",
    "manual_region", "partial_replicate_dot", "iota_transposed_tiles",
    "maximal_sharding", "manual_subgroup",
}


def _ids(paths):
    return [("hw/" if p.parent == HW_DIR else "") + p.stem for p in paths]


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def _module(json_path):
    """The module of a fixture: from the .pb if there is one, else from the .hlo."""
    pb = json_path.with_suffix(".pb")
    if pb.exists():
        return _hlo.HloModule.from_serialized_hlo_module_proto(pb.read_bytes())
    return _hlo.hlo_module_from_text(json_path.with_suffix(".hlo").read_text())


def _ir(json_path):
    """The fixture as the project's IR (our loader reads .pb and .hlo alike)."""
    from hlo_spmd.ir.io import load_module

    pb = json_path.with_suffix(".pb")
    return load_module(pb if pb.exists() else json_path.with_suffix(".hlo"))


# ---------------------------------------------------------------------------


def test_expected_fixtures_present():
    assert EXPECTED_GENERATED <= {p.stem for p in GENERATED}
    assert EXPECTED_HANDWRITTEN <= {p.stem for p in HANDWRITTEN}


def test_fixture_budget():
    total = sum(p.stat().st_size for p in GEN_DIR.rglob("*") if p.is_file())
    assert total < 5 * 1024 * 1024, total


@pytest.mark.parametrize("path", GENERATED, ids=_ids(GENERATED))
def test_generated_files_present(path):
    for ext in (".pb", ".hlo", ".json"):
        assert path.with_suffix(ext).is_file(), ext


@pytest.mark.parametrize("path", HANDWRITTEN, ids=_ids(HANDWRITTEN))
def test_handwritten_files_present(path):
    assert path.with_suffix(".hlo").is_file()


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_sidecar_schema(path):
    meta = _load(path)
    for key, typ in REQUIRED_KEYS.items():
        assert key in meta, key
        assert isinstance(meta[key], typ), key
    assert meta["name"] == path.stem
    assert meta["form"] in ("classic", "shardy")
    assert meta["form"] == ("shardy" if path.stem.startswith("shardy_") else "classic")
    axes = meta["mesh"]["axes"]
    assert axes and all(isinstance(v, int) and v > 0 for v in axes.values())
    assert math.prod(axes.values()) == meta["num_partitions"]
    assert meta["num_partitions"] in meta["partition_counts"]
    assert meta["main_ops"] and all(isinstance(o, str) for o in meta["main_ops"])
    assert meta["inputs"] and meta["outputs"]
    for e in meta["inputs"] + meta["outputs"]:
        assert isinstance(e["shape"], list) and all(isinstance(d, int) for d in e["shape"])
        assert e["dtype"] in DTYPES, e["dtype"]
        _hlo.HloSharding.from_string(e["sharding"])  # parses
    for e in meta["inputs"]:
        assert VALUE_RE.match(e["value"]), e["value"]
        if e["value"].startswith("int_range"):
            lo, hi = map(int, e["value"].split(":")[1:])
            assert lo < hi and e["dtype"].startswith("int")


@pytest.mark.parametrize("path", GENERATED, ids=_ids(GENERATED))
def test_pb_parses_and_matches_text(path):
    module = _hlo.HloModule.from_serialized_hlo_module_proto(path.with_suffix(".pb").read_bytes())
    # The .hlo is jaxlib's printed text of the very same module.
    assert module.to_string() == path.with_suffix(".hlo").read_text()
    assert "/work/" not in module.to_string()  # no absolute source paths leaked


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_hlo_text_parses(path):
    text = path.with_suffix(".hlo").read_text()
    module = _hlo.hlo_module_from_text(text)
    assert text.startswith("HloModule ")
    assert "entry_computation_layout={" in text.splitlines()[0]
    # Re-printing and re-parsing is stable (up to metadata: the text parser
    # renumbers the stack-frame index).
    opts = _hlo.HloPrintOptions()
    opts.print_metadata = False
    again = _hlo.hlo_module_from_text(module.to_string())
    assert again.to_string(opts) == module.to_string(opts)


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_entry_signature_matches_sidecar(path):
    from hlo_spmd.ir.primitive_types import text_name
    from hlo_spmd.sharding import parse_sharding

    meta = _load(path)
    entry = _ir(path).entry
    # Sidecar inputs are the arrays the runtime passes: a tuple parameter's elements.
    leaves = []
    for p in entry.parameters:
        assert p.sharding is not None, f"parameter {p.name} has no sharding"
        if p.shape.is_tuple:
            elems = p.sharding.tuple_elements if p.sharding.is_tuple else \
                [p.sharding] * len(p.shape.tuple_shapes)
            leaves += [(p.name, s, e) for s, e in zip(p.shape.tuple_shapes, elems)]
        else:
            leaves.append((p.name, p.shape, p.sharding))
    assert [p.parameter_number for p in entry.parameters] == list(range(len(entry.parameters)))
    assert len(leaves) == len(meta["inputs"])
    for (name, shape, sharding), inp in zip(leaves, meta["inputs"]):
        assert list(shape.dims) == inp["shape"], (name, inp)
        assert text_name(shape.element_type) == DTYPES[inp["dtype"]], (name, inp)
        assert sharding == parse_sharding(inp["sharding"]), (name, str(sharding), inp)
    root = entry.root.shape
    outs = list(root.tuple_shapes) if root.is_tuple else [root]
    assert [list(o.dims) for o in outs] == [o["shape"] for o in meta["outputs"]]
    assert [text_name(o.element_type) for o in outs] == [DTYPES[o["dtype"]] for o in meta["outputs"]]


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_main_ops_and_form(path):
    meta = _load(path)
    module = _ir(path)
    ops = {i.opcode for i in module.instructions()}
    assert set(meta["main_ops"]) <= ops, set(meta["main_ops"]) - ops
    text = _module(path).to_string()
    assert ("xla.sdy" in text) == (meta["form"] == "shardy")


def _jax_version():
    try:
        from importlib.metadata import version
        return version("jax")
    except Exception:
        return None


@pytest.mark.skipif(not GENERATED, reason="no generated fixtures")
def test_generator_reproduces_fixtures(tmp_path):
    """fixtures/generate.py is deterministic and the committed files are up to date."""
    gen = {_load(p)["generator"] for p in GENERATED}
    if gen != {f"jax {_jax_version()}"}:
        pytest.skip(f"fixtures made with {gen}, installed jax {_jax_version()}")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, str(FIXTURES / "generate.py"), "--out", str(tmp_path)],
                   check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    for p in GENERATED:
        for ext in (".pb", ".hlo", ".json"):
            fresh = (tmp_path / p.stem).with_suffix(ext)
            assert fresh.read_bytes() == p.with_suffix(ext).read_bytes(), f"{p.stem}{ext} stale"
