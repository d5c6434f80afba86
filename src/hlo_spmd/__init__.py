"""hlo-spmd: a standalone SPMD partitioner for XLA HLO modules (GSPMD, Xu et al. 2021).

The Python API (see README, "Python API"): ``hlo_spmd.load(src)`` and
``hlo_spmd.partition(src, num_partitions=None, mesh=None, shard=None)``; both live in
:mod:`hlo_spmd.api` and are imported on first use, so ``import hlo_spmd`` stays cheap.
``hlo_spmd.search(src, mesh=..., memory_limit=..., shard=None)`` chooses the shardings
(:mod:`hlo_spmd.search`).
"""
__version__ = "0.1.0"

_API = ("load", "partition", "annotate", "PartitionResult")
_SEARCH = ("search",)


def __getattr__(name: str):
    if name in _API:
        from hlo_spmd import api

        return getattr(api, name)
    if name in _SEARCH:
        import hlo_spmd.search  # a callable package: hlo_spmd.search(src, mesh=...)

        return hlo_spmd.search
    raise AttributeError(f"module 'hlo_spmd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API) + list(_SEARCH))
