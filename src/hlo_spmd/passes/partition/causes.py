"""Why each collective exists: a scope stack read by the collective factory.

XLA's partitioner leaves users guessing which op a collective serves and why ("involuntary
full rematerialization", openxla/xla#15207). Here the reason is recorded where a
collective is created: code that emits collectives runs inside a scope naming the cause
(``reshard``, ``contraction``, ``reduction``, ``halo``, ``fallback``), the driver adds the
input instruction being partitioned (``for``), and ``reshard`` adds the from/to
shardings. :class:`~hlo_spmd.collectives.factory.CollectiveFactory` notes the current
scope on every collective it creates; collectives copied from the input (already manual
user code) carry no note and are reported as cause ``user``.

A reshard inside the fallback stays ``fallback`` (the op's operands were replicated
because the op has no partitioned handler); elsewhere the innermost cause wins.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from hlo_spmd.records import FrozenRecord

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.sharding import HloSharding

CAUSES = ("reshard", "contraction", "reduction", "halo", "fallback", "user")


class Scope(NamedTuple):
    """One level of the stack (a NamedTuple: one is made per instruction and reshard)."""
    cause: str | None = None
    serves: "Instruction | None" = None
    src: "HloSharding | None" = None
    dst: "HloSharding | None" = None


class Remat(FrozenRecord):
    """A sharded value made whole on every device although its target is not replicated
    (reshard through replicated), or because its user has no partitioned handler."""
    # A records.FrozenRecord: a frozen dataclass costs ~0.4-0.8 ms to create at import.
    __match_args__ = ("serves", "opcode", "src", "dst", "cause")
    __slots__ = __match_args__

    def __init__(self, serves: str | None, opcode: str | None, src: str, dst: str,
                 cause: str) -> None:
        self._set_fields(serves, opcode, src, dst, cause)

    def message(self) -> str:
        op = f"{self.serves} ({self.opcode})" if self.serves else "the result"
        why = ("no partitioned handler" if self.cause == "fallback"
               else "no cheaper route between the shardings")
        return f"full rematerialization for {op}: {self.src} -> {self.dst} ({why})"


class CauseLog:
    """The scope stack and what was noted; shared by every factory of one run."""

    def __init__(self) -> None:
        self._stack: list[Scope] = [Scope()]
        # id(output instruction) -> (instruction, scope). The instruction is kept so that
        # an id is never reused by another object while the log lives.
        self.notes: dict[int, tuple[Any, Scope]] = {}
        self.remats: list[Remat] = []

    @property
    def current(self) -> Scope:
        return self._stack[-1]

    def scope(self, cause: str | None = None, serves: "Instruction | None" = None,
              src: "HloSharding | None" = None, dst: "HloSharding | None" = None) -> "_Entered":
        """A context manager: inside it, the current scope has ``cause`` (else the
        enclosing one's) and the given ``serves`` / ``src`` / ``dst`` (else the enclosing
        ones). Entered for every instruction and every reshard: a plain class, not a
        generator-based context manager, keeps that cheap."""
        return _Entered(self._stack, cause, serves, src, dst)

    def enter_instruction(self, inst: "Instruction") -> None:
        """``scope(None, inst).__enter__()`` for the driver, which enters one scope per
        instruction of the module (no context-manager object); ``leave`` ends it."""
        stack = self._stack
        top = stack[-1]
        stack.append(_scope((top.cause, inst, top.src, top.dst)))  # (what _push makes)

    def leave(self) -> None:
        """End the innermost scope begun by ``enter_instruction``."""
        self._stack.pop()

    def note(self, inst: "Instruction") -> "Instruction":
        """Record the current scope on a collective just created; returns it."""
        self.notes[id(inst)] = (inst, self._stack[-1])
        return inst

    def inherit(self, new: "Instruction", old: "Instruction") -> None:
        """``new`` replaces collective ``old`` (a tidy rewrite): it serves what ``old`` did."""
        scope = self.lookup(old)
        if scope is not None:
            self.notes[id(new)] = (new, scope)

    def lookup(self, inst: "Instruction") -> Scope | None:
        got = self.notes.get(id(inst))
        return got[1] if got is not None and got[0] is inst else None

    def note_replicate(self, src: "HloSharding") -> None:
        """``replicate`` is about to gather a tiled value whole: a full rematerialization
        unless the value was asked for replicated by its user."""
        top = self.current
        if top.cause != "fallback" and (top.dst is None or top.dst.is_replicated):
            return
        dst = top.dst if top.dst is not None and top.cause != "fallback" else None
        serves = top.serves
        self.remats.append(Remat(serves.name if serves is not None else None,
                                 serves.opcode if serves is not None else None,
                                 str(src), str(dst) if dst is not None else "{replicated}",
                                 top.cause or "reshard"))


class _Entered:
    __slots__ = ("stack", "args")

    def __init__(self, stack: list[Scope], *args: Any) -> None:
        self.stack = stack
        self.args = args

    def __enter__(self) -> Scope:
        return _push(self.stack, *self.args)

    def __exit__(self, *exc: Any) -> None:
        self.stack.pop()


def _push(stack: list[Scope], cause: str | None, serves: "Instruction | None",
          src: "HloSharding | None", dst: "HloSharding | None") -> Scope:
    """Enter a scope (what ``CauseLog.scope`` documents); the caller pops it."""
    top = stack[-1]
    if cause is None or (cause == "reshard" and top.cause == "fallback"):
        cause = top.cause
    new = _scope((cause, serves if serves is not None else top.serves,
                  src if src is not None else top.src, dst if dst is not None else top.dst))
    stack.append(new)
    return new


# A Scope from its four fields without the NamedTuple's generated ``__new__`` (one call
# per instruction and per reshard; the same tuple subclass and fields).
_scope = functools.partial(tuple.__new__, Scope)


def _log(ctx: Any) -> CauseLog:
    return ctx.f.log


def with_cause(cause: str) -> Callable:
    """Decorator for functions ``f(ctx, ...)``: collectives created inside have ``cause``."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            # The scope entered and left directly (no context-manager object): this
            # wraps every reduce and dot emission.
            stack = ctx.f.log._stack
            _push(stack, cause, None, None, None)
            try:
                return fn(ctx, *args, **kwargs)
            finally:
                stack.pop()
        return inner
    return wrap


def reshard_scope(fn: Callable) -> Callable:
    """Decorator for ``reshard(ctx, pv, target)``: cause ``reshard`` with from/to. A value
    that already has ``target`` is returned as it is (what ``reshard`` does), unscoped."""
    @functools.wraps(fn)
    def inner(ctx: Any, pv: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        s = pv.sharding
        if s is target or s == target:  # ``reshard`` returns the value as it is
            return pv
        stack = ctx.f.log._stack
        _push(stack, "reshard", None, s, target)
        try:
            return fn(ctx, pv, target, *args, **kwargs)
        finally:
            stack.pop()
    return inner


def replicate_scope(fn: Callable) -> Callable:
    """Decorator for ``replicate(ctx, pv)``: notes full rematerializations."""
    @functools.wraps(fn)
    def inner(ctx: Any, pv: Any, *args: Any, **kwargs: Any) -> Any:
        s = pv.sharding
        if s.is_tiled and any(t > 1 for t in s.tile_dims_for_data()):
            _log(ctx).note_replicate(s)
        return fn(ctx, pv, *args, **kwargs)
    return inner


__all__ = ["CAUSES", "CauseLog", "Scope", "Remat", "with_cause", "reshard_scope",
           "replicate_scope"]
