"""Test session set-up.

- 8 host CPU devices for every test that uses the XLA runtime, set before any test module
  imports jax, so one process can run 1-, 2-, 4- and 8-device programs in any order.
- Hypothesis: no per-example deadline (the machine is shared and compiles vary in time;
  speed is measured in benchmarks/, never asserted), and derandomized under CI so a CI
  run is reproducible. Locally examples stay random and failures are saved for replay.
"""
import os

from hypothesis import settings

from hlo_spmd.runtime.devices import ensure_host_devices

ensure_host_devices(8)

settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
