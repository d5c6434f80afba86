"""Infeed / outfeed on {maximal device=k} shardings (patterns of XLA's own partitioner
tests, written here). An infeed or outfeed cannot run in the CPU test runtime, so these
check the partitioned structure: which devices execute the effect (the owner table the
conditional's predicate reads), on which shapes, and that nothing is moved."""
from __future__ import annotations

import numpy as np

import hlo_spmd
from hlo_spmd.ir.literal import literal_to_numpy
from hlo_spmd.stats import module_stats


def _conditional(module):
    conds = [i for i in module.instructions() if i.opcode == "conditional"]
    assert len(conds) == 1, [i.opcode for i in module.instructions()]
    return conds[0]


def _executing_devices(cond, n: int) -> list[int]:
    """The devices whose predicate is true: the owner table is a constant read at the
    partition id (or, when every device agrees, a folded scalar constant)."""
    pred = cond.operands[0]
    assert pred.opcode == "compare", pred.opcode
    lhs, rhs = pred.operands
    one = int(np.asarray(literal_to_numpy(rhs.attrs.literal)).reshape(()))
    x = lhs
    while x.opcode in ("reshape", "dynamic-slice"):
        x = x.operands[0]
    assert x.opcode == "constant", x.opcode
    table = np.asarray(literal_to_numpy(x.attrs.literal)).reshape(-1)
    if table.size == 1:
        table = np.repeat(table, n)
    return [d for d in range(n) if table[d] == one]


def test_outfeed_of_a_value_on_its_own_device_moves_nothing():
    text = """HloModule m
ENTRY e {
  tok = token[] after-all()
  data = f32[1024]{0} parameter(0), sharding={maximal device=2}
  ROOT o = token[] outfeed(data, tok), sharding={maximal device=2}
}
"""
    r = hlo_spmd.partition(text, 4)
    assert module_stats(r.module, 4).total_bytes_per_device == 0
    cond = _conditional(r.module)
    assert _executing_devices(cond, 4) == [2]
    body = [i for i in cond.called_computations[0].instructions if i.opcode == "outfeed"]
    assert len(body) == 1 and tuple(body[0].operands[0].shape.dims) == (1024,)


def test_outfeed_of_a_value_on_another_device_moves_it_once():
    text = """HloModule m
ENTRY e {
  tok = token[] after-all()
  data = f32[1024]{0} parameter(0), sharding={maximal device=0}
  ROOT o = token[] outfeed(data, tok), sharding={maximal device=3}
}
"""
    r = hlo_spmd.partition(text, 4)
    ops = [i.opcode for i in r.module.instructions()]
    assert ops.count("collective-permute") == 1 and "all-reduce" not in ops, ops
    assert _executing_devices(_conditional(r.module), 4) == [3]


def test_infeed_whose_tuple_leaves_are_on_different_devices():
    # XLA runs such an infeed on every device; each leaf is valid on the device it names.
    text = """HloModule m
ENTRY e {
  token0 = token[] after-all(), sharding={maximal device=0}
  infeed = ((f32[9,2]{1,0}, f32[2]{0}), token[]) infeed(token0),
    sharding={{maximal device=0}, {maximal device=3}, {maximal device=0}}
  ROOT d = (f32[9,2]{1,0}, f32[2]{0}) get-tuple-element(infeed), index=0,
    sharding={{maximal device=0}, {maximal device=3}}
}
"""
    r = hlo_spmd.partition(text, 4)
    assert module_stats(r.module, 4).total_bytes_per_device == 0
    cond = _conditional(r.module)
    assert _executing_devices(cond, 4) == [0, 3]
    feeds = [i for i in cond.called_computations[0].instructions if i.opcode == "infeed"]
    assert len(feeds) == 1
    data = feeds[0].shape.tuple_shapes[0]
    assert [tuple(s.dims) for s in data.tuple_shapes] == [(9, 2), (2,)]
