"""What the handler families share, registering no handler themselves.

``handlers/`` holds only op families (each module registers handlers, listed in
``handlers.FAMILIES``), so a reader looking for the handler of an opcode opens one
family module (``hlo-spmd rules OPCODE`` names it). The pieces those families build on
live here, beside them: ``common`` (emitting an instruction like another, every
family), ``strategy`` (plans as data: candidates priced in the one cost model, only
the cheapest emitted), ``local_dims`` (ops
that act along some dims only: sort), ``dot_dims`` / ``dot_plan`` / ``dot_windowed``
(the dot family's dims model, planner and windowed einsum, shared with convolution and
gather/scatter), ``dynamic_window`` (dynamic-slice without gathering: shapes) and
``rotate`` (pipeline rotations as collective-permutes: slicing). Importing this package
registers nothing.
"""
