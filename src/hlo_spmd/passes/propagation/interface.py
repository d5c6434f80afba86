"""The propagation run as its rules and memos see it: the fix point's public interface.

``engine.Propagator`` owns the run (the level loop, the walk, the caches); the forward
and backward rules, shard groups, open-dims refinement, Shardy manual regions and the
fix point's skip memo use it only through what ``PropagatorInterface`` lists.  They
import this module rather than the engine, so the engine can import them without an
import cycle, and a reader sees in one place what a rule may ask of the run.
"""
from __future__ import annotations

from typing import Any, Protocol

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation.dims import DotDims
from hlo_spmd.passes.propagation.graph import Graph
from hlo_spmd.passes.propagation.improve import Verdict
from hlo_spmd.passes.propagation.provenance import Recorder
from hlo_spmd.sharding import HloSharding


class PropagatorInterface(Protocol):
    """What a rule, memo or helper of propagation may use of the running ``Propagator``."""

    graph: Graph
    rec: Recorder
    # Ids of instructions whose sharding is fixed (user annotations), and the open dims
    # of open-dims annotations by id.
    provided: set[int]
    unspecified: dict[int, tuple[int, ...]]
    groups: Any             # ``shard_groups.ShardGroups`` (which imports the rules)
    direction: str          # the recorder's direction of the running inference
    # The level notes (``at_least``): reset and read by the skip memo around an inference.
    level_read: bool
    level_lo: int
    level_hi: int

    @property
    def level(self) -> int:
        """The aggressiveness level, read as a number (the inference depends on it
        exactly; prefer ``at_least``)."""

    def at_least(self, k: int, level: int | None = None) -> bool:
        """Whether the level is >= ``k`` (noted for the skip memo)."""

    @property
    def may_combine(self) -> bool:
        """``at_least(1)``: whether shardings may be merged."""

    def verdict(self, inst: Instruction, cand: HloSharding, allow: bool = False) -> Verdict:
        """ReturnImprovedSharding for ``inst`` (memoised)."""

    def improve(self, inst: Instruction, cand: HloSharding, rule: str,
                sources: tuple[Instruction, ...], allow: bool = False) -> bool:
        """MaybeImproveInstructionSharding: adopt ``cand`` if it improves ``inst``."""

    def improve_sub(self, inst: Instruction, cand: HloSharding, index: int, rule: str,
                    sources: tuple[Instruction, ...], allow: bool = False) -> bool:
        """MaybeImproveInstructionSubSharding (tuple element ``index``)."""

    def set(self, inst: Instruction, sharding: HloSharding, rule: str,
            sources: tuple[Instruction, ...] = (), direction: str | None = None) -> None:
        """Give ``inst`` ``sharding`` (recorded, and the dirty set told)."""

    def reject(self, inst: Instruction, cand: HloSharding, rule: str,
               sources: tuple[Instruction, ...], reason: str) -> None:
        """Record a rejected candidate."""

    def dot_dims(self, inst: Instruction) -> DotDims:
        """The dot dimension numbers of a dot or convolution (cached for the run)."""

    def lookahead_user_sharding(self, inst: Instruction) -> HloSharding | None:
        """LookaheadUserSharding."""

    def user_rule(self, user: Instruction) -> Any:
        """``backward.user_rule`` of ``user``, once per run (a ``backward.UserRule``)."""

    def forward_facts(self, inst: Instruction) -> Any:
        """What the forward inference of ``inst`` reads that never changes in a run, and
        its skip-memo entry (an ``engine.ForwardFacts``, a ``unchanged.MemoEntry``)."""

    def backward_facts(self, inst: Instruction) -> Any:
        """The same for the backward inference (an ``engine.BackwardFacts``): its users
        and their ``backward.UserRule``."""

    def infer_from_operands(self, inst: Instruction) -> bool:
        """InferShardingFromOperands (True if ``inst``'s sharding changed)."""

    def infer_from_users(self, inst: Instruction) -> bool:
        """InferShardingFromUsers (True if ``inst``'s sharding changed)."""

