"""Keep XLA's own C++ log lines (``W1201 ... sharding_propagation.cc ...``) out of
``verify``'s output unless ``--xla-logs`` asks for them.

The log level variables are set before jax is first imported (they are read once, at
load); lines the C++ runtime writes regardless go to file descriptor 2 directly, so that
descriptor is pointed at a temporary file while XLA runs, and restored after.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

_LEVEL_VARS = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_CPP_MAX_VLOG_LEVEL": "0",
               "ABSL_MIN_LOG_LEVEL": "3", "GLOG_minloglevel": "3"}


@contextmanager
def quiet_xla(enabled: bool = True) -> Iterator[None]:
    if not enabled:
        yield
        return
    for k, v in _LEVEL_VARS.items():
        os.environ.setdefault(k, v)
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr descriptor (embedded use): levels only
        yield
        return
    sink = tempfile.TemporaryFile()
    try:
        os.dup2(sink.fileno(), 2)
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        sink.close()
