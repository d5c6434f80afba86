"""Exact prices: an assignment of entry-parameter shardings is priced by completing and
partitioning the whole module with it (``api.partition_owned``) and reading the real
program's figures -- the one cost model, never an estimate of our own.

* ``bytes``: bytes per device the collectives move, each weighted by its loop's trip
  count (the report's ``in_loop``; a loop of unknown trip count counts once);
* ``collectives``: how many collectives the program has;
* ``peak``: the ``stats`` peak-live estimate of the per-device program.

Order (:func:`price_key`): within the memory limit first; then fewer bytes, fewer
collectives, less memory. Over the limit, a smaller peak is better (toward a fit).
Prices are cached per assignment: the search asks for the same one many times.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.search.candidates import Mesh, Spec, spec_text


class Price(NamedTuple):
    bytes: float
    collectives: int
    peak: int


def price_key(price: Price | None, limit: int | None) -> tuple:
    """Smaller is better (see the module docstring); None (could not partition) is last."""
    if price is None:
        return (2,)
    if limit is not None and price.peak > limit:
        return (1, price.peak, price.bytes, price.collectives)
    return (0, price.bytes, price.collectives, price.peak)


def weighted_bytes(report: dict) -> float:
    """Collective bytes per device, loops weighted by their known trip counts."""
    total = 0.0
    for c in report["collectives"]:
        trips = c["in_loop"]
        n = trips if isinstance(trips, int) and not isinstance(trips, bool) else 1
        total += c["bytes_per_device"] * n
    return total


def price_of(result) -> Price:
    """The Price of an ``api.PartitionResult`` (report included)."""
    from hlo_spmd.stats import computation_peak_bytes

    module = result.module
    peak = computation_peak_bytes(module.entry, True) if module.entry is not None else 0
    return Price(weighted_bytes(result.report), len(result.report["collectives"]), peak)


def target(key: int | str) -> str:
    """An assignment key as a ``--shard`` target: parameter ``k`` -> ``#k``; outputs
    (``out``, ``out#K``) as they are."""
    return f"#{key}" if isinstance(key, int) else key


def assignment_key(assignment: Mapping) -> tuple:
    return tuple(sorted((target(k), s) for k, s in assignment.items()))


def shard_list(assignment: Mapping[int | str, Spec]) -> list[str]:
    """``{0: ("data", None), "out": ...}`` -> ``["#0=data,_", "out=..."]`` (the --shard
    form)."""
    return [f"{k}={spec_text(s)}" for k, s in assignment_key(assignment)]


class Pricer:
    """Partitions ``base`` (serialized; its own annotations are kept) with assignments."""

    def __init__(self, base: bytes, mesh: Mesh, num_partitions: int) -> None:
        self.base = base
        self.mesh = mesh
        self.num_partitions = num_partitions
        self.cache: dict[tuple, Price | None] = {}
        self.partitions = 0  # whole-module partitions run (cache misses)
        #: assignment key -> (instruction name -> sharding after completion), for the
        #: assignments priced with ``keep`` (the local pricer pins slice borders to them)
        self.kept: dict[tuple, dict[str, object]] = {}
        #: (assignment key, completed source, api.PartitionResult) of the last assignment
        #: priced with ``keep``: the search's final program when the incumbent wins,
        #: so a large module is not partitioned once more for it
        self.last_kept: tuple | None = None

    def module(self):
        from hlo_spmd.api import load

        return load(self.base, verify=False)

    def run(self, assignment: Mapping[int, Spec]):
        """(source module after completion, api.PartitionResult) of one assignment."""
        from hlo_spmd.api import partition_owned

        module = self.module()
        self.partitions += 1
        result = partition_owned(module, self.num_partitions, self.mesh,
                                 shard_list(assignment))
        return module, result

    def price(self, assignment: Mapping[int, Spec], keep: bool = False) -> Price | None:
        """The assignment's Price (cached). ``keep``: also remember the shardings its
        completed program gives every entry instruction (:meth:`completed`)."""
        key = assignment_key(assignment)
        if key in self.cache and (not keep or key in self.kept):
            return self.cache[key]
        try:
            source, result = self.run(assignment)
            got: Price | None = price_of(result)
            if keep:
                self.kept[key] = {i.name: i.sharding for i in source.entry.instructions}
                self.last_kept = (key, source, result)
        except HloSpmdError:
            got = None  # a candidate the partitioner rejects is simply not a choice
        self.cache[key] = got
        return got

    def completed(self, assignment: Mapping[int, Spec]) -> dict[str, object]:
        """The shardings kept for ``assignment`` (priced with ``keep``)."""
        return self.kept[assignment_key(assignment)]


__all__ = ["Price", "Pricer", "price_key", "price_of", "weighted_bytes", "shard_list"]
