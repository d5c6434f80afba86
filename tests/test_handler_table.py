"""The handler table is strict and complete: every opcode XLA defines has one handler or a
named reason for having none, no opcode or custom-call target is registered twice, and
every family of handlers.FAMILIES registers exactly what ``hlo-spmd rules`` prints for
it. The map itself is read from the registry (``hlo-spmd rules`` prints it), never copied
here."""
from __future__ import annotations

import pytest

import hlo_spmd.passes.partition.driver  # noqa: F401  (imports every handler family)
from hlo_spmd.ir.opcodes import ALL_OPCODES, ELEMENTWISE
from hlo_spmd.passes.partition import handlers
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.registry import (CUSTOM_CALL_HANDLERS, HANDLERS, NO_HANDLER,
                                                DuplicateHandlerError, handles,
                                                handles_custom_call, without_handler)
from hlo_spmd.passes.rules import rules_table

PREFIX = handlers.__name__ + "."


def _short(fn) -> str:
    assert fn.__module__.startswith(PREFIX), fn.__module__
    return fn.__module__[len(PREFIX):] + "." + fn.__name__


def test_every_opcode_has_a_handler_or_a_named_reason():
    for op in sorted(ALL_OPCODES):
        assert (op in HANDLERS) != (op in NO_HANDLER), op
    assert set(HANDLERS) | set(NO_HANDLER) == set(ALL_OPCODES)
    assert all(isinstance(r, str) and len(r.split()) >= 3 for r in NO_HANDLER.values())
    # (an op of an elementwise kind is never left to the fallback)
    assert not set(ELEMENTWISE) & set(NO_HANDLER)


def test_each_family_registers_what_rules_prints():
    rows = rules_table()
    printed: dict[str, dict[tuple[str, str], str]] = {}
    for r in rows:
        registered = (HANDLERS if r.kind == "opcode" else CUSTOM_CALL_HANDLERS).get(r.name)
        if registered is None:  # the fallback, with its reason
            assert (r.handler_module, r.handler_function.split(" ")[0]) == \
                (handle_replicated.__module__, handle_replicated.__name__), r
            assert r.kind == "custom-call" or NO_HANDLER[r.name] in r.handler_function, r
            continue
        assert r.handler_module.startswith(PREFIX), r
        family = r.handler_module[len(PREFIX):]
        printed.setdefault(family, {})[(r.kind, r.name)] = r.handler_function
    for family in handlers.FAMILIES:
        module = PREFIX + family
        registered = {("opcode", op): fn.__qualname__ for op, fn in HANDLERS.items()
                      if fn.__module__ == module}
        registered |= {("custom-call", t): fn.__qualname__
                       for t, fn in CUSTOM_CALL_HANDLERS.items() if fn.__module__ == module}
        assert registered, f"family {family} registers nothing"
        assert printed.get(family) == registered, family


def test_rules_print_every_custom_call_target_registered():
    targets = {r.name for r in rules_table() if r.kind == "custom-call"}
    assert set(CUSTOM_CALL_HANDLERS) <= targets


def test_every_registering_module_is_a_listed_family():
    modules = {fn.__module__ for fn in HANDLERS.values()}
    modules |= {fn.__module__ for fn in CUSTOM_CALL_HANDLERS.values()}
    assert modules == {PREFIX + f for f in handlers.FAMILIES}


def test_handlers_holds_only_the_families():
    # handlers/ is the families (each registers a handler); what they share and does not
    # register lives in passes/partition/support/.
    from pathlib import Path

    here = Path(handlers.__file__).parent
    assert sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__") == \
        sorted(handlers.FAMILIES)


def test_second_registration_is_an_error():
    def other(ctx, inst):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(DuplicateHandlerError, match="'dot' already has handler"):
        handles("dot")(other)
    with pytest.raises(DuplicateHandlerError, match="'Sharding'"):
        handles_custom_call("Sharding")(other)
    # A failed registration leaves the table untouched (no partial registration either).
    with pytest.raises(DuplicateHandlerError):
        handles("some-new-op", "dot")(other)
    assert "some-new-op" not in HANDLERS
    assert _short(HANDLERS["dot"]) == "dot.handle_dot"


def test_an_opcode_has_a_handler_or_a_reason_never_both():
    def other(ctx, inst):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(DuplicateHandlerError, match="'dot' already has handler"):
        without_handler("a reason of its own", "dot")
    with pytest.raises(DuplicateHandlerError, match="'fft' is declared without a handler"):
        handles("fft")(other)
    with pytest.raises(DuplicateHandlerError, match="'fft' is already declared"):
        without_handler("another reason", "fft")
    assert "fft" not in HANDLERS and "dot" not in NO_HANDLER
