"""Per-op-family handlers; importing this package registers them all."""
from hlo_spmd.passes.partition.handlers import basic, elementwise  # noqa: F401
