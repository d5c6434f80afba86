"""all_distinct (sharding/device_ids.py) agrees with np.unique, and partitioning does not
pull in numpy.ma (what np.unique's masked-array check would import)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hlo_spmd.sharding.device_ids import all_distinct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("seed", range(40))
def test_all_distinct_agrees_with_unique(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 12))
    shape = (n,) if seed % 3 else (n, 2)
    ids = rng.integers(-3, 2 * n + 2, size=shape) if seed % 2 else \
        rng.permutation(int(np.prod(shape))).reshape(shape)
    assert all_distinct(ids) == (np.unique(ids).size == ids.size)


def test_all_distinct_edges():
    assert all_distinct(np.array([], np.int64))
    assert all_distinct(np.array([5]))
    assert not all_distinct(np.array([[1, 2], [3, 1]]))


def test_partition_does_not_import_numpy_ma(tmp_path):
    src = os.path.join(ROOT, "fixtures", "hlo", "mlp_2d_megatron.pb")
    # The command ends the process itself (os._exit after the exit handlers): the
    # question is asked from an exit handler.
    code = ("import atexit, sys, runpy; sys.argv = ['hlo-spmd', 'partition', sys.argv[1], "
            "'-o', sys.argv[2], '-n', '8', '--quiet']\n"
            "atexit.register(lambda: print('numpy.ma' in sys.modules))\n"
            "runpy.run_module('hlo_spmd_cli', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, src, str(tmp_path / "out.pb")],
                          capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
