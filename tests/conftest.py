"""Test session set-up: 8 host CPU devices for every test that uses the XLA runtime.

Set before any test module imports jax, so one process can run 1-, 2-, 4- and 8-device
programs whatever order the files run in.
"""
from hlo_spmd.runtime.devices import ensure_host_devices

ensure_host_devices(8)
