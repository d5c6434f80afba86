"""Provenance of propagated shardings: which rule and neighbour produced each decision.

Every accepted sharding change becomes the instruction's current ``Decision`` (earlier
ones move to ``history``); every candidate that was offered and refused is kept as an
``Alternative`` with the reason it lost.  ``explain_chain`` walks the sources of a
decision back to the user annotations it ultimately comes from.
"""
from __future__ import annotations

from typing import Mapping, Protocol

from hlo_spmd.records import FrozenRecord, Record
from hlo_spmd.sharding import HloSharding

# Why a candidate lost.
NOT_FINER = "not finer"
INCOMPATIBLE = "incompatible"
TILE_MAXIMAL = "tile-maximal candidate"
MANUAL = "manual candidate"
LOWER_PRIORITY = "lower priority"
FIXED = "fixed annotation"

DIRECTIONS = ("user", "forward", "backward", "computation", "preprocess", "manual",
              "refine", "default")
MAX_ALTERNATIVES = 12


# Alternative and Decision are hlo_spmd.records classes (equality, hash and repr as the
# dataclasses they were; a dataclass costs ~0.4-0.8 ms to create at import).
class Alternative(FrozenRecord):
    """A candidate sharding that was offered to an instruction and not taken."""
    __match_args__ = ("sharding", "rule", "sources", "reason", "level", "iteration")
    __slots__ = __match_args__

    def __init__(self, sharding: HloSharding, rule: str, sources: tuple[str, ...],
                 reason: str, level: int, iteration: int) -> None:
        self._set_fields(sharding, rule, sources, reason, level, iteration)

    def __str__(self) -> str:
        src = ", ".join(self.sources) or "-"
        return f"{self.sharding} via {self.rule} from {src}: {self.reason}"


class Decision(Record):
    """The sharding an instruction ended with and how it got there."""
    __match_args__ = ("name", "sharding", "rule", "direction", "sources", "level",
                      "iteration", "alternatives", "history")
    __slots__ = __match_args__

    def __init__(self, name: str, sharding: HloSharding | None, rule: str, direction: str,
                 sources: tuple[str, ...] = (), level: int = -1, iteration: int = -1,
                 alternatives: list[Alternative] | None = None,
                 history: list[Decision] | None = None) -> None:
        self.name = name
        self.sharding = sharding
        self.rule = rule
        self.direction = direction
        self.sources = sources
        self.level = level
        self.iteration = iteration
        self.alternatives = [] if alternatives is None else alternatives
        self.history = [] if history is None else history

    def __str__(self) -> str:
        src = ", ".join(self.sources) or "-"
        where = f"level {self.level}, iteration {self.iteration}" if self.level >= 0 else "setup"
        return (f"{self.name}: {self.sharding} [{self.direction}] {self.rule} <- {src} "
                f"({where})")


class Recorder:
    """Collects decisions while propagation runs (keyed by instruction name)."""

    def __init__(self) -> None:
        self.decisions: dict[str, Decision] = {}
        self.level = -1
        self.iteration = -1

    def accept(self, name: str, sharding: HloSharding | None, rule: str, direction: str,
               sources: tuple[str, ...]) -> None:
        old = self.decisions.get(name)
        new = Decision(name, sharding, rule, direction, sources, self.level, self.iteration)
        if old is not None:
            new.alternatives = old.alternatives
            new.history = old.history + [Decision(old.name, old.sharding, old.rule,
                                                  old.direction, old.sources, old.level,
                                                  old.iteration)]
        self.decisions[name] = new

    def reject(self, name: str, sharding: HloSharding, rule: str, sources: tuple[str, ...],
               reason: str) -> None:
        d = self.decisions.get(name)
        if d is None:
            d = Decision(name, None, "none", "default")
            self.decisions[name] = d
        alt = Alternative(sharding, rule, sources, reason, self.level, self.iteration)
        for a in d.alternatives:
            if a.sharding == sharding and a.rule == rule and a.sources == sources:
                return
        if len(d.alternatives) < MAX_ALTERNATIVES:
            d.alternatives.append(alt)


class HasDecisions(Protocol):
    """A propagation result (``PropagationResult``): its decisions by instruction name."""
    decisions: Mapping[str, Decision]


def explain_chain(result: HasDecisions, name: str) -> list[Decision]:
    """Decisions from ``name`` back through its sources to a user annotation (or default).

    Follows the first source of each decision; stops at a decision without sources
    or when a source was already visited (a while loop's carry, say).
    """
    chain: list[Decision] = []
    seen: set[str] = set()
    current: str | None = name
    while current is not None and current not in seen:
        seen.add(current)
        d = result.decisions.get(current)
        if d is None:
            break
        chain.append(d)
        current = next((s for s in d.sources if s not in seen), None)
    return chain
