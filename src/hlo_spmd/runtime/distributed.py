"""Running a per-device SPMD program as K OS processes, the way a multi-host job runs it.

Each of the K processes owns N/K host CPU devices and joins the others through
``jax.distributed`` (a coordinator on a loopback address and a free port; jaxlib's gloo
CPU collectives carry the cross-process all-reduce / all-gather / ... traffic). Every
process compiles the same program for all N devices, feeds the pieces of its own devices
and writes back what its devices returned; the caller reassembles the global outputs
exactly as for a one-process run (:func:`hlo_spmd.runtime.run.run_partitioned_detailed`).

The worker is a plain function (:func:`worker`) run by ``python -c`` in a fresh process:
the device count of a process is fixed when jax starts, so it cannot be the caller's.
Children always end: a bounded wait, then a kill, on every path out.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from hlo_spmd.errors import HloSpmdError

#: Seconds a multi-process run may take, start-up and compile included.
DEFAULT_TIMEOUT = 300.0
_LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_LOOPBACK, 0))
        return int(s.getsockname()[1])


def _child_env(local_devices: int) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [
        f"--xla_force_host_platform_device_count={local_devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # the children must import this very copy of hlo_spmd
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    return env


def execute_multiprocess(proto_bytes: bytes, per_param_pieces: Sequence[Sequence[np.ndarray]],
                         num_devices: int, num_processes: int, *,
                         timeout: float = DEFAULT_TIMEOUT) -> list[list[np.ndarray]]:
    """Run a per-device program on ``num_devices`` devices spread over ``num_processes``
    processes; the same contract as :func:`hlo_spmd.runtime.run.execute_per_device`
    (``per_param_pieces[p][d]`` in, ``results[o][d]`` out)."""
    k, n = int(num_processes), int(num_devices)
    if k < 1 or n % k:
        raise HloSpmdError(f"--processes {k} does not divide the {n} devices evenly")
    local = n // k
    with tempfile.TemporaryDirectory(prefix="hlo_spmd_mp_") as tmp:
        work = Path(tmp)
        (work / "module.pb").write_bytes(proto_bytes)
        for p, pieces in enumerate(per_param_pieces):
            for d, piece in enumerate(pieces):
                np.save(work / f"in_{p}_{d}.npy", np.asarray(piece), allow_pickle=False)
        spec = {"num_devices": n, "num_processes": k, "num_params": len(per_param_pieces),
                "coordinator": f"{_LOOPBACK}:{_free_port()}"}
        (work / "spec.json").write_text(json.dumps(spec))
        code = ("import sys; from hlo_spmd.runtime.distributed import worker; "
                "worker(sys.argv[1], int(sys.argv[2]))")
        env = _child_env(local)
        children: list[subprocess.Popen] = []
        logs = []
        try:
            for i in range(k):
                log = open(work / f"log_{i}.txt", "wb")
                logs.append(log)
                children.append(subprocess.Popen(
                    [sys.executable, "-c", code, str(work), str(i)], env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
            _wait_all(children, timeout, work)
        finally:
            for child in children:  # every path out: no child outlives the call
                if child.poll() is None:
                    child.kill()
                    child.wait()
            for log in logs:
                log.close()
        outputs = json.loads((work / "outputs.json").read_text())["count"] \
            if (work / "outputs.json").exists() else None
        if outputs is None:
            raise HloSpmdError("the multi-process run wrote no outputs")
        return [[np.load(work / f"out_{o}_{d}.npy", allow_pickle=False) for d in range(n)]
                for o in range(outputs)]


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [line for line in text.splitlines() if line.strip()
            and not line.startswith(("W", "I")) or "Error" in line]
    return " | ".join(keep[-lines:])


def _wait_all(children: list[subprocess.Popen], timeout: float, work: Path) -> None:
    """Wait for every child; the first failure or the deadline ends them all (the caller
    kills what is left)."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [c.poll() for c in children]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            i = failed[0]
            raise HloSpmdError(f"process {i} of the multi-process run failed "
                               f"(exit {codes[i]}): {_tail(work / f'log_{i}.txt')}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise HloSpmdError(f"the multi-process run did not finish within {timeout:g} s")
        time.sleep(0.05)


def worker(work_dir: str, process_id: int) -> None:
    """One process of :func:`execute_multiprocess` (run in a fresh interpreter)."""
    work = Path(work_dir)
    spec = json.loads((work / "spec.json").read_text())
    n, k = int(spec["num_devices"]), int(spec["num_processes"])
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=spec["coordinator"], num_processes=k,
                               process_id=process_id, initialization_timeout=120)
    try:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from hlo_spmd.runtime.compile import compile_options

        # partition p runs on the p-th device by id (process i's ids are not i*L..)
        devices = sorted(jax.devices(), key=lambda d: d.id)
        if len(devices) != n:
            raise HloSpmdError(f"{len(devices)} devices joined, expected {n}")
        from jaxlib import xla_client as xc

        stablehlo = xc._xla.mlir.hlo_to_stablehlo((work / "module.pb").read_bytes())
        executable = devices[0].client.compile_and_load(
            stablehlo, xc.DeviceList(tuple(devices)),
            compile_options(n, [d.id for d in devices]))
        partition_of = {d.id: p for p, d in enumerate(devices)}
        mine = [d for d in devices if d.process_index == jax.process_index()]
        replicated = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())
        with jax.enable_x64(True):  # s64 / f64 parameters keep their width
            args = []
            for p in range(int(spec["num_params"])):
                pieces = [np.load(work / f"in_{p}_{partition_of[d.id]}.npy",
                                  allow_pickle=False) for d in mine]
                buffers = [jax.device_put(x, d) for x, d in zip(pieces, mine)]
                args.append(jax.make_array_from_single_device_arrays(
                    pieces[0].shape, replicated, buffers))
            results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
            for o, per_device in enumerate(results):
                for buf in per_device:
                    (dev,) = buf.devices()
                    np.save(work / f"out_{o}_{partition_of[dev.id]}.npy", np.asarray(buf),
                            allow_pickle=False)
        if process_id == 0:
            (work / "outputs.json").write_text(json.dumps({"count": len(results)}))
    finally:
        jax.distributed.shutdown()
