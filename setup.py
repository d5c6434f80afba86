"""Package discovery only (everything else is in setup.cfg): the library lives in src/,
the CLI in cli/ (imported as hlo_spmd_cli), so packages are found rather than listed."""
from setuptools import find_packages, setup

setup(
    package_dir={"": "src", "hlo_spmd_cli": "cli"},
    packages=find_packages("src") + ["hlo_spmd_cli"],
)
