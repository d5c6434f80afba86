"""The search report (``hlo-spmd search --report``, ``hlo_spmd.search(...).report``):
per entry parameter and output the chosen sharding in mesh-axis form (``--shard`` text
and ``PartitionSpec(...)``) and in HLO form; the chosen intermediate constraints
(instruction name, mesh-axis and HLO forms); the winner's bytes per device, collectives
and peak; the same figures for each named baseline (with whether it fits the limit);
and how the search went (groups, candidates, rounds, partitions priced, seconds).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hlo_spmd.ir.module import Module
from hlo_spmd.search.candidates import Mesh, Spec, partition_spec_text, spec_text
from hlo_spmd.search.pricing import Price, assignment_key


def figures(price: Price | None, limit: int | None) -> dict:
    if price is None:
        return {"bytes_per_device": None, "collectives": None, "peak_bytes": None,
                "fits": False}
    return {"bytes_per_device": price.bytes, "collectives": price.collectives,
            "peak_bytes": price.peak, "fits": limit is None or price.peak <= limit}


def _spec_of(form: str | None, rank: int) -> Spec | None:
    if form is None:
        return None
    if form == "replicated":
        return ()
    return tuple(None if e == "_" else e if "+" not in e else tuple(e.split("+"))
                 for e in form.split(",")) if rank else ()


def _entry(sharding, shape, mesh: Mesh) -> dict:
    from hlo_spmd.annotations.cli_spec import mesh_form

    rank = shape.rank if shape.is_array else None
    form = mesh_form(sharding, rank, mesh) if sharding is not None else None
    spec = _spec_of(form, rank or 0)
    return {"shape": shape.to_text(print_layout=False),
            "spec": spec_text(spec) if spec is not None else None,
            "partition_spec": partition_spec_text(spec) if spec is not None else None,
            "hlo": str(sharding) if sharding is not None else None}


def build_report(source: Module, mesh: Mesh, limit: int | None, price: Price,
                 baselines: Mapping[str, tuple[Mapping[int, Spec], Price | None]],
                 fixed: set[int], groups: Sequence[Sequence[Any]], search: dict,
                 constraints: Sequence[dict] = ()) -> dict:
    """``source``: the annotated module after completion (every parameter and the root
    carry their final shardings)."""
    from hlo_spmd.annotations.cli_spec import mesh_text

    from hlo_spmd.search.candidates import member_key

    group_of = {member_key(p): g for g, members in enumerate(groups) for p in members}
    params = []
    for p in source.entry.parameters:
        row = {"parameter": p.parameter_number, "name": p.name}
        row.update(_entry(p.sharding, p.shape, mesh))
        row["fixed"] = p.parameter_number in fixed
        row["group"] = group_of.get(p.parameter_number)
        params.append(row)
    root = source.entry.root
    outputs = []
    if root.shape.is_tuple:
        for k, shape in enumerate(root.shape.tuple_shapes):
            s = root.sharding
            if s is not None and s.is_tuple:
                s = s.tuple_elements[k]
            outputs.append({"output": k, **_entry(s, shape, mesh)})
    else:
        outputs.append({"output": None, **_entry(root.sharding, root.shape, mesh)})
    return {
        "mesh": mesh_text(mesh),
        "memory_limit": limit,
        "winner": figures(price, limit),
        "parameters": params,
        "outputs": outputs,
        "constraints": list(constraints),
        "baselines": {name: {**figures(p, limit),
                             "parameters": {t: spec_text(s) for t, s in assignment_key(a)}}
                      for name, (a, p) in baselines.items()},
        "search": search,
    }


__all__ = ["build_report", "figures"]
