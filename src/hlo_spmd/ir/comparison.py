"""A compare's ordering, in both of the encodings XLA has used.

XLA up to jaxlib 0.10 encodes how a compare orders its operands as a *type*
(``comparison_type``, field 72, text ``type=``: FLOAT, TOTALORDER, SIGNED, UNSIGNED);
XLA since jaxlib 0.11 as an *order* (``comparison_order``, field 102, text ``order=``:
TOTAL or PARTIAL) and reads only that field from a proto, while the older releases read
only the type.  A sort of floats with NaNs changes meaning when the order is lost, so a
module written by hlo-spmd carries both fields whenever the ordering is not the element
type's default (the default needs neither: both readers assume it).

Facts checked against jaxlib 0.10.2 and 0.12: the default is PARTIAL (type FLOAT) for
floating-point and complex element types and TOTAL (type SIGNED / UNSIGNED) for the
others; type TOTALORDER, SIGNED and UNSIGNED read as order TOTAL, FLOAT as PARTIAL.
"""
from __future__ import annotations

from typing import Any

from hlo_spmd.ir.primitive_types import PrimitiveType

P = PrimitiveType

COMPARISON_TYPES = ("FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED")
COMPARISON_ORDERS = ("TOTAL", "PARTIAL")

_FLOATISH = {P.F16, P.F32, P.F64, P.BF16, P.F8E5M2, P.F8E4M3FN, P.F8E4M3B11FNUZ,
             P.F8E5M2FNUZ, P.F8E4M3FNUZ, P.F8E4M3, P.F8E3M4, P.F8E8M0FNU, P.F4E2M1FN,
             P.C64, P.C128}
_SIGNED = {P.S1, P.S2, P.S4, P.S8, P.S16, P.S32, P.S64}


def _is_floatish(element_type: int) -> bool:
    try:
        return PrimitiveType(element_type) in _FLOATISH
    except ValueError:
        return True


def default_comparison_type(element_type: int) -> str:
    """Comparison::DefaultComparisonType: FLOAT / SIGNED / UNSIGNED (PRED is unsigned)."""
    if _is_floatish(element_type):
        return "FLOAT"
    if PrimitiveType(element_type) in _SIGNED:
        return "SIGNED"
    return "UNSIGNED"


def default_order(element_type: int) -> str:
    """PARTIAL for floating-point (and complex) element types, TOTAL for the others."""
    return "PARTIAL" if _is_floatish(element_type) else "TOTAL"


def order_of_type(comparison_type: str, element_type: int) -> str:
    """The order a comparison type means (an empty type is the element type's default)."""
    if not comparison_type:
        return default_order(element_type)
    return "PARTIAL" if comparison_type == "FLOAT" else "TOTAL"


def type_of_order(order: str, element_type: int) -> str:
    """The comparison type an older XLA needs for ``order`` on ``element_type``."""
    if order == "PARTIAL":
        return "FLOAT"
    return "TOTALORDER" if _is_floatish(element_type) else default_comparison_type(element_type)


def order(attrs: Any, element_type: int) -> str:
    """The order of a compare whose attributes are ``attrs`` (either encoding)."""
    if attrs.comparison_order:
        return attrs.comparison_order
    return order_of_type(attrs.comparison_type, element_type)


def complete_encodings(attrs: Any, element_type: int) -> None:
    """Give ``attrs`` (an HloInstructionProto of a compare, about to be written) the
    encoding it lacks when its ordering is not the default, so readers of either XLA
    generation see the same compare.  The order wins when both are present and differ."""
    given = attrs.comparison_order
    if given:
        if attrs.comparison_type and order_of_type(attrs.comparison_type, element_type) == given:
            return
        if attrs.comparison_type or given != default_order(element_type):
            attrs.comparison_type = type_of_order(given, element_type)
        return
    if attrs.comparison_type:
        wanted = order_of_type(attrs.comparison_type, element_type)
        if wanted != default_order(element_type):
            attrs.comparison_order = wanted
