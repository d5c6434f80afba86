"""Per-op-family handlers. ``FAMILIES`` is the one list of handler modules; importing this
package imports (and so registers) each of them, and nothing else registers handlers.
A new family is added here; an opcode without a handler is declared with
``registry.without_handler`` and its reason (``hlo-spmd rules`` prints the map)."""
from importlib import import_module

from hlo_spmd.passes.partition.registry import CUSTOM_CALL_HANDLERS, HANDLERS, Handler

FAMILIES = (
    "basic", "elementwise", "control_flow", "misc", "reduce", "slicing", "shapes", "dot",
    "sort", "gather_scatter", "convolution", "windows", "batch_norm", "linalg",
)

for _family in FAMILIES:
    import_module(f"{__name__}.{_family}")


def handler_tables() -> tuple[dict[str, Handler], dict[str, Handler]]:
    """(opcode -> handler, custom-call target -> handler), every family registered: the
    map itself, importable (``hlo-spmd rules`` prints it)."""
    return dict(HANDLERS), dict(CUSTOM_CALL_HANDLERS)
