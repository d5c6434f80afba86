"""hlo-spmd: a standalone SPMD partitioner for XLA HLO modules (GSPMD, Xu et al. 2021)."""
__version__ = "0.1.0"
