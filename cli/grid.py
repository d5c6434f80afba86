"""``show --grid NAME``: which device holds which tile of a value, as a table (what
``jax.debug.visualize_array_sharding`` draws). Rows are the tiles of the first sharded
dim, columns those of the second; a cell lists every device holding that tile (several
under partial replication). Values with more than two sharded dims list one row per tile.
"""
from __future__ import annotations

import itertools

import numpy as np


def _ranges(size: int, tiles: int) -> list[str]:
    step = -(-size // tiles) if tiles else size
    return [f"[{min(k * step, size)}:{min((k + 1) * step, size)})" for k in range(tiles)]


def _devs(ids) -> str:
    ids = sorted(int(d) for d in np.asarray(ids).reshape(-1))
    return ",".join(map(str, ids))


def tile_grid(inst) -> dict:
    """Title, optional note, columns and rows of the grid of ``inst``'s sharding."""
    from hlo_spmd.errors import HloSpmdError

    s, shape = inst.sharding, inst.shape
    title = f"{inst.name}: {shape.to_text(print_layout=False)} {s if s is not None else '(no sharding)'}"
    if shape.is_tuple and (s is None or s.is_tuple):
        raise HloSpmdError(f"{inst.name} is a tuple; --grid takes an array value "
                           "(name a get-tuple-element)")
    if s is None or s.is_replicated:
        return {"title": title, "note": "every device holds the whole value",
                "columns": ["tile", "devices"], "rows": [["whole", "all"]]}
    if s.is_tuple:
        raise HloSpmdError(f"{inst.name} has a tuple sharding; --grid takes an array value "
                           "(name a get-tuple-element)")
    if s.is_maximal:
        return {"title": title, "note": None, "columns": ["tile", "devices"],
                "rows": [["whole", str(s.device)]]}
    if s.is_manual:
        return {"title": title, "note": "manual: every device holds its own value",
                "columns": ["tile", "devices"], "rows": [["own", "all"]]}
    if not shape.is_array:
        raise HloSpmdError(f"{inst.name} is not an array value")
    rank = shape.rank
    arr = s.tile_assignment.array()
    data = arr.reshape(arr.shape[:rank] + (-1,))  # trailing subgroup dims: holders of a tile
    sharded = [d for d in range(rank) if data.shape[d] > 1]
    note = None
    if data.shape[-1] > 1:
        note = f"partially replicated: each tile on {data.shape[-1]} devices"
    if not sharded:
        return {"title": title, "note": note, "columns": ["tile", "devices"],
                "rows": [["whole", _devs(data)]]}
    dims = shape.dims
    if len(sharded) <= 2:
        r = sharded[0]
        c = sharded[1] if len(sharded) == 2 else None
        rr = _ranges(dims[r], data.shape[r])
        cr = _ranges(dims[c], data.shape[c]) if c is not None else ["devices"]
        columns = [f"dim {r} \\ dim {c}" if c is not None else f"dim {r}"] + cr
        rows = []
        for i in range(data.shape[r]):
            row = [rr[i]]
            for j in range(len(cr)):
                idx = [0] * rank
                idx[r] = i
                if c is not None:
                    idx[c] = j
                row.append(_devs(data[tuple(idx)]))
            rows.append(row)
        return {"title": title, "note": note, "columns": columns, "rows": rows}
    columns = [f"dim {d}" for d in sharded] + ["devices"]
    rows = []
    for combo in itertools.product(*(range(data.shape[d]) for d in sharded)):
        idx = [0] * rank
        for d, k in zip(sharded, combo):
            idx[d] = k
        rows.append([_ranges(dims[d], data.shape[d])[k] for d, k in zip(sharded, combo)]
                    + [_devs(data[tuple(idx)])])
    return {"title": title, "note": note, "columns": columns, "rows": rows}
