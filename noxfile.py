"""The test matrix for developers and CI matrices: `make test-matrix` (or `nox`).

* ``tests-3.11`` / ``tests-3.12`` / ``tests-3.13``: install '.[dev,xla,search]' (jax/jaxlib
  0.10.2, the pinned runtime) into a fresh virtualenv of that Python and run the suite.
* ``xla_new``: Python 3.12 with '.[dev,xla-new,search]' (the newest jax/jaxlib, 0.12): the
  tests that run partitioned programs on that runtime and read its modules. (Golden
  comparisons with jaxlib's own HLO text / proto defaults are written for 0.10.2.)

`make test` (CI's `.ci/run`) stays one Python; each session here takes ~10-20 minutes on
a small machine. Interpreters are found on PATH (pyenv: `pyenv shell 3.11 3.12 3.13`).
Extra arguments go to pytest: `nox -s tests-3.12 -- -x tests/test_api.py`.
"""
from __future__ import annotations

import nox

nox.options.sessions = ["tests", "xla_new"]
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.11", "3.12", "3.13"]

# Tests that run programs on the runtime (and read JAX's own modules): what the newest
# jaxlib is checked with.
DIFFERENTIAL = [
    "tests/test_jax012_modules.py",
    "tests/test_propagate_to_output.py",
    "tests/test_partition_fixtures.py",
    "tests/test_runtime_harness.py",
    "tests/test_api.py",
    "tests/test_partition_dot.py",
    "tests/test_partition_sort.py",
    "tests/test_partition_control_flow.py",
    "tests/test_proto_schema.py::test_schema_matches_jaxlib_descriptors",
    "tests/test_text_parser.py::test_allowed_attributes_match_jaxlib",
]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite (as `make test`) on one Python version."""
    session.install("-e", ".[dev,xla,search]")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python="3.12")
def xla_new(session: nox.Session) -> None:
    """The differential tests against the newest jax/jaxlib (extra 'xla-new')."""
    session.install("-e", ".[dev,xla-new,search]")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                *(session.posargs or DIFFERENTIAL))
