"""The records of one partitioning run (its report, the user's options, the state every
context of the run shares) and ``ReshardContext``, what reshard and the pieces it plans
with (reshard_routes, unreduced, recreate, padding) read of a partition context.

They sit below ``context`` so that reshard's pieces can name the context's type without
importing ``context``, which imports ``reshard`` (its ``operand`` and ``reshard`` methods
are reshard's entry for handlers)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.module import Module
from hlo_spmd.records import Record

if TYPE_CHECKING:
    import numpy as np

    from hlo_spmd.collectives.factory import CollectiveFactory
    from hlo_spmd.collectives.groups import DeviceGrouping
    from hlo_spmd.ir.builder import Builder
    from hlo_spmd.ir.shape import Shape
    from hlo_spmd.passes.partition.pvalue import PValue
    from hlo_spmd.sharding import HloSharding


# The three records below are hlo_spmd.records.Record classes (a dataclass costs ~0.4-0.8
# ms to create at import); equality and repr as the dataclasses had.
class PartitionReport(Record):
    """What the partitioner did that a user may want to know."""
    __match_args__ = ("replicated_fallbacks", "unknown_custom_calls", "unsharded_inputs",
                      "handler_of", "causes")
    # + ``dot_plans``: instruction name -> the dot handler's chosen plan (handlers/dot.py);
    # outside equality and repr.
    __slots__ = __match_args__ + ("dot_plans",)

    def __init__(self, replicated_fallbacks: list[tuple[str, str]] | None = None,
                 unknown_custom_calls: list[tuple[str, str]] | None = None,
                 unsharded_inputs: list[str] | None = None,
                 handler_of: dict[str, str] | None = None, causes: object = None) -> None:
        self.replicated_fallbacks = (  # (name, opcode)
            [] if replicated_fallbacks is None else replicated_fallbacks)
        # custom-calls whose target has no partitioning rule: (instruction name, target)
        self.unknown_custom_calls = (
            [] if unknown_custom_calls is None else unknown_custom_calls)
        self.unsharded_inputs = [] if unsharded_inputs is None else unsharded_inputs
        self.handler_of = {} if handler_of is None else handler_of
        self.causes = causes  # causes.CauseLog: why each output collective exists
        self.dot_plans: dict[str, str] = {}


class PartitionOptions(Record):
    """User choices that change the program (not its numbers)."""
    __match_args__ = ("windowed_einsum_threshold_mib", "windowed_einsum_bidirectional",
                      "combine_threshold_mib")
    __slots__ = __match_args__

    def __init__(self, windowed_einsum_threshold_mib: float | None = None,
                 windowed_einsum_bidirectional: bool = False,
                 combine_threshold_mib: float | None = 30.0) -> None:
        # XLA's threshold_for_windowed_einsum_mib: a dot whose operand all-gather is larger
        # (MiB per device) runs as a loop of collective-permutes (support/dot_windowed.py).
        # None: off.
        self.windowed_einsum_threshold_mib = windowed_einsum_threshold_mib
        # two streams of pieces, half the steps
        self.windowed_einsum_bidirectional = windowed_einsum_bidirectional
        # XLA's combine_threshold_in_bytes: independent collectives of one kind and device
        # grouping are combined into one while the result stays under this many MiB
        # (passes/partition/combine.py). 0 or None: off.
        self.combine_threshold_mib = combine_threshold_mib


class ModuleState(Record):
    """Shared by every context of one partitioning run."""
    __match_args__ = ("source", "out", "num_devices", "report", "clone_memo",
                      "reshard_cache", "options")
    __slots__ = __match_args__ + ("origins", "settled", "_users", "_user_counts",
                                  "_readers")

    def __init__(self, source: Module, out: Module, num_devices: int,
                 report: PartitionReport, clone_memo: dict[int, Computation] | None = None,
                 reshard_cache: dict[tuple, tuple] | None = None,
                 options: PartitionOptions | None = None) -> None:
        self.source = source
        self.out = out
        self.num_devices = num_devices
        self.report = report
        self.clone_memo = {} if clone_memo is None else clone_memo
        # reshard's memory (reshard.py): (computation, device grouping, value, target) ->
        # the value already produced, so every later user shares one set of collectives.
        self.reshard_cache = {} if reshard_cache is None else reshard_cache
        self.options = PartitionOptions() if options is None else options
        # (id(local instruction), global dims) -> (it, the source instruction whose
        # handler made it, an array): what
        # reshard asks to re-make a value instead of moving it (partition/recreate.py).
        self.origins: dict[tuple, tuple[Instruction, Instruction]] = {}
        # id(source instruction) -> its value, made early by the handler of an
        # instruction it depends on (a sort's top-k slices, made by the two-stage sort);
        # None: the instruction has no value of its own (every user of it is settled too).
        # The driver takes these instead of running the instruction's handler.
        self.settled: dict[int, PValue | None] = {}
        self._users: dict[int, list[Instruction | None]] | None = None
        self._user_counts: dict[int, int] | None = None
        self._readers: dict[str, dict[int, list[Instruction]]] = {}

    def users(self) -> dict[int, list[Instruction | None]]:
        """id(source instruction) -> the instructions that read it, each once; a root's
        list holds None for its computation's caller. Built once, on first ask."""
        if self._users is None:
            comps = self.source.computations
            users: dict[int, list[Instruction | None]] = iter_operand_users(
                inst for comp in comps for inst in comp.instructions)   # type: ignore[assignment]
            for comp in comps:
                if comp.root is not None:
                    users.setdefault(id(comp.root), []).append(None)
            self._users = users
        return self._users

    def readers(self, opcode: str) -> dict[int, list[Instruction]]:
        """id(source instruction) -> the ``opcode`` instructions that read it, each once.
        For a look-ahead that asks about one kind of user: built once per opcode, without
        the whole module's use lists (``users``)."""
        found = self._readers.get(opcode)
        if found is None:
            found = self._readers[opcode] = iter_operand_users(
                inst for comp in self.source.computations for inst in comp.instructions
                if inst.opcode == opcode)
        return found

    def user_counts(self) -> dict[int, int]:
        """id(source instruction) -> how many instructions read it (a root counts as
        read); built once, on first ask."""
        if self._user_counts is None:
            self._user_counts = {k: len(v) for k, v in self.users().items()}
        return self._user_counts


class ReshardContext(Protocol):
    """What reshard and its pieces use of a ``context.PartitionContext`` (the one class
    that has it). ``reshard`` and ``reshard_price`` are the way back into reshard for the
    pieces that reshard a value's operands (recreate re-makes an op from its operands,
    a reshard step goes through an intermediate sharding)."""
    state: ModuleState
    b: "Builder"
    f: "CollectiveFactory"
    values: dict[int, "PValue"]

    @property
    def grouping(self) -> "DeviceGrouping": ...

    @property
    def num_devices(self) -> int: ...

    def value(self, inst: Instruction) -> "PValue": ...

    def reshard(self, pv: "PValue", target: "HloSharding") -> "PValue": ...

    def reshard_price(self, pv: "PValue", target: "HloSharding",
                      recreate: bool = True) -> tuple[float, float]: ...

    def emit_like(self, inst: Instruction, operands: Sequence[Instruction],
                  local_shape: "Shape", name: str | None = None) -> Instruction: ...

    def local_shape(self, shape: "Shape", sharding: "HloSharding") -> "Shape": ...

    def logical_table(self, values: "np.ndarray") -> Instruction: ...
