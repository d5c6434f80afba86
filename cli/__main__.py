"""`python -m hlo_spmd_cli` runs the command line."""
from hlo_spmd_cli.main import main

main()
