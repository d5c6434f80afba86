"""Per-op-family handlers; importing this package registers them all."""
from hlo_spmd.passes.partition.handlers import basic, elementwise  # noqa: F401
from hlo_spmd.passes.partition.handlers import control_flow, misc, reduce  # noqa: F401
from hlo_spmd.passes.partition.handlers import shapes  # noqa: F401
from hlo_spmd.passes.partition.handlers import dot  # noqa: F401
from hlo_spmd.passes.partition.handlers import local_dims  # noqa: F401
from hlo_spmd.passes.partition.handlers import convolution  # noqa: F401
from hlo_spmd.passes.partition.handlers import windows  # noqa: F401
