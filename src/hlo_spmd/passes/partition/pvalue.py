"""A partitioned value: the per-device instruction plus the global shape and sharding it
stands for. Local dims are ceil(global dim / tiles), padding at the end holds garbage
unless a handler masks it."""
from __future__ import annotations

from typing import NamedTuple

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.shape import Shape
from hlo_spmd.sharding import HloSharding


# A NamedTuple, not a frozen dataclass: several are made per instruction, and a tuple is
# immutable at a third of the construction cost.
class PValue(NamedTuple):
    hlo: Instruction          # the local instruction in the partitioned module
    base_shape: Shape         # the global (unpartitioned) shape
    sharding: HloSharding     # over logical devices of the current device group

    @property
    def local_shape(self) -> Shape:
        return self.hlo.shape

    def with_hlo(self, hlo: Instruction, sharding: HloSharding | None = None) -> "PValue":
        return PValue(hlo, self.base_shape, sharding if sharding is not None else self.sharding)
