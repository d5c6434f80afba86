"""``hlo-spmd search``: choose the shardings of a module's entry parameters and outputs on
a mesh, under a per-device memory budget, so that the partitioned program moves the
fewest bytes per device. Modules: candidates (decision space, structural groups),
pricing (exact prices by partitioning), solver (the integer program, HiGHS), baselines
(data parallel, FSDP, Megatron), report, driver (the rounds). XLA's auto-sharding pass
(the Alpa ILP) had this role; it is gone from current XLA.

``hlo_spmd.search(src, mesh=..., memory_limit=...)`` is the API; importing this package
makes Python bind the name ``hlo_spmd.search`` to the package itself, so the package is
made callable (it calls :func:`~hlo_spmd.search.driver.search`) and the one name serves
as both.
"""
import sys
import types

from hlo_spmd.search.driver import SearchError, SearchResult, search


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["search", "SearchResult", "SearchError"]
