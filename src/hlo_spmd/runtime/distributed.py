"""Running a per-device SPMD program as K OS processes, the way a multi-host job runs it.

Each of the K processes owns N/K host CPU devices and joins the others through
``jax.distributed`` (a coordinator on a loopback address and a free port; jaxlib's gloo
CPU collectives carry the cross-process all-reduce / all-gather / ... traffic). Every
process compiles the same program for all N devices, feeds the pieces of its own devices
and writes back what its devices returned; the caller reassembles the global outputs
exactly as for a one-process run (:func:`hlo_spmd.runtime.run.run_partitioned_detailed`).

A :class:`ProcessGroup` starts the K workers once and runs program after program on
them; :func:`execute_multiprocess` is a group of one program. The worker is a plain
function (:func:`worker`) run by ``python -c`` in a fresh process (the device count of a
process is fixed when jax starts, so it cannot be the caller's). Caller and workers talk
through files in a private temporary directory: a job's module and per-device inputs as
``.npy`` files, then ``go.json``; each worker answers ``done_<i>`` (its devices' outputs
written) or ``error_<i>.txt``. Children always end: a bounded wait, then a kill, on every
path out; a worker also stops when its parent is gone.
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


class ProcessGroup:
    """K worker processes joined through jax.distributed, ``num_devices / K`` CPU devices
    each, that run one program after another (start-up and the join are paid once).

    Use as a context manager; :meth:`execute` runs one per-device program. A failed or
    timed-out run closes the group (its processes are killed: a peer left waiting in a
    collective cannot be trusted with the next program).
    """

    def __init__(self, num_devices: int, num_processes: int, *,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        k, n = int(num_processes), int(num_devices)
        if k < 1 or n % k:
            raise HloSpmdError(f"{k} processes do not divide the {n} devices evenly")
        self.num_devices, self.num_processes, self.timeout = n, k, float(timeout)
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._children: list[subprocess.Popen] = []
        self._logs: list = []
        self._jobs = 0

    def __enter__(self) -> "ProcessGroup":
        self._tmp = tempfile.TemporaryDirectory(prefix="hlo_spmd_mp_")
        work = Path(self._tmp.name)
        spec = {"num_devices": self.num_devices, "num_processes": self.num_processes,
                "coordinator": f"{_LOOPBACK}:{_free_port()}", "parent": os.getpid()}
        (work / "spec.json").write_text(json.dumps(spec))
        code = ("import sys; from hlo_spmd.runtime.distributed import worker; "
                "worker(sys.argv[1], int(sys.argv[2]))")
        env = _child_env(self.num_devices // self.num_processes)
        try:
            for i in range(self.num_processes):
                log = open(work / f"log_{i}.txt", "wb")
                self._logs.append(log)
                self._children.append(subprocess.Popen(
                    [sys.executable, "-c", code, str(work), str(i)], env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def work(self) -> Path:
        if self._tmp is None:
            raise HloSpmdError("the process group is closed")
        return Path(self._tmp.name)

    def execute(self, proto_bytes: bytes, per_param_pieces: Sequence[Sequence[np.ndarray]]
                ) -> list[list[np.ndarray]]:
        """Run one per-device program: ``per_param_pieces[p][d]`` in, ``results[o][d]`` out
        (the contract of :func:`hlo_spmd.runtime.run.execute_per_device`)."""
        job = self.work / f"job_{self._jobs}"
        self._jobs += 1
        job.mkdir()
        (job / "module.pb").write_bytes(proto_bytes)
        for p, pieces in enumerate(per_param_pieces):
            if len(pieces) != self.num_devices:
                raise HloSpmdError(f"{len(pieces)} pieces for {self.num_devices} devices")
            for d, piece in enumerate(pieces):
                np.save(job / f"in_{p}_{d}.npy", np.asarray(piece), allow_pickle=False)
        (job / "params.json").write_text(json.dumps({"count": len(per_param_pieces)}))
        (job / "params.json").rename(job / "go.json")  # the workers start on this name
        try:
            self._wait(job)
        except BaseException:
            self.close()
            raise
        errors = sorted(job.glob("error_*.txt"))
        if errors:
            raise HloSpmdError(errors[0].read_text().strip())
        count = json.loads((job / "outputs.json").read_text())["count"]
        return [[np.load(job / f"out_{o}_{d}.npy", allow_pickle=False)
                 for d in range(self.num_devices)] for o in range(count)]

    def _wait(self, job: Path) -> None:
        deadline = time.monotonic() + self.timeout
        k = self.num_processes
        while True:
            finished = sum((job / f"done_{i}").exists() or (job / f"error_{i}.txt").exists()
                           for i in range(k))
            if finished == k:
                return
            for i, child in enumerate(self._children):
                if child.poll() is not None:
                    raise HloSpmdError(
                        f"process {i} of the multi-process run ended (exit {child.returncode})"
                        f": {_tail(self.work / f'log_{i}.txt')}")
            if time.monotonic() > deadline:
                raise HloSpmdError(
                    f"the multi-process run did not finish within {self.timeout:g} s")
            time.sleep(0.02)

    def close(self) -> None:
        """Stop the workers (a bounded wait, then a kill) and remove the work files."""
        if self._tmp is None:
            return
        try:
            (Path(self._tmp.name) / "stop").touch()
        except OSError:
            pass
        deadline = time.monotonic() + 10
        for child in self._children:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in self._children:  # every path out: no child outlives the group
            if child.poll() is None:
                child.kill()
                child.wait()
        for log in self._logs:
            log.close()
        self._children, self._logs = [], []
        self._tmp.cleanup()
        self._tmp = None


def execute_multiprocess(proto_bytes: bytes, per_param_pieces: Sequence[Sequence[np.ndarray]],
                         num_devices: int, num_processes: int, *,
                         timeout: float = DEFAULT_TIMEOUT) -> list[list[np.ndarray]]:
    """Run one per-device program on ``num_devices`` devices spread over ``num_processes``
    processes (a :class:`ProcessGroup` of one job)."""
    with ProcessGroup(num_devices, num_processes, timeout=timeout) as group:
        return group.execute(proto_bytes, per_param_pieces)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # the last lines that are not XLA's own log lines (they start "W1203 ..." / "I1203 ...")
    keep = [line.strip() for line in text.splitlines()
            if line.strip() and (line[:1] not in ("W", "I") or "Error" in line)]
    return " | ".join(keep[-lines:])


def _parent_alive(pid: int) -> bool:
    return os.getppid() == pid


def worker(work_dir: str, process_id: int) -> None:
    """One process of a :class:`ProcessGroup` (run in a fresh interpreter): join the
    group, then run each job as it appears until told to stop or the parent is gone."""
    work = Path(work_dir)
    spec = json.loads((work / "spec.json").read_text())
    n, k = int(spec["num_devices"]), int(spec["num_processes"])
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=spec["coordinator"], num_processes=k,
                               process_id=process_id, initialization_timeout=120)
    try:
        # partition p runs on the p-th device by id (process i's ids are not i*L..)
        devices = sorted(jax.devices(), key=lambda d: d.id)
        if len(devices) != n:
            raise HloSpmdError(f"{len(devices)} devices joined, expected {n}")
        j = 0
        while True:
            job = work / f"job_{j}"
            if (job / "go.json").exists():
                try:
                    _run_job(jax, job, devices, process_id)
                    (job / f"done_{process_id}").touch()
                except Exception as exc:  # reported to the parent, which decides
                    first = " ".join(str(exc).strip().splitlines()[:4])
                    (job / f"error_{process_id}.txt").write_text(
                        f"process {process_id}: {type(exc).__name__}: {first}")
                j += 1
                continue
            if (work / "stop").exists() or not _parent_alive(int(spec["parent"])):
                return
            time.sleep(0.02)
    finally:
        jax.distributed.shutdown()


def _run_job(jax, job: Path, devices: list, process_id: int) -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from jaxlib import xla_client as xc

    from hlo_spmd.runtime.compile import compile_options

    n = len(devices)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo((job / "module.pb").read_bytes())
    executable = devices[0].client.compile_and_load(
        stablehlo, xc.DeviceList(tuple(devices)), compile_options(n, [d.id for d in devices]))
    partition_of = {d.id: p for p, d in enumerate(devices)}
    mine = [d for d in devices if d.process_index == jax.process_index()]
    replicated = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())
    with jax.enable_x64(True):  # s64 / f64 parameters keep their width
        args = []
        for p in range(int(json.loads((job / "go.json").read_text())["count"])):
            pieces = [np.load(job / f"in_{p}_{partition_of[d.id]}.npy", allow_pickle=False)
                      for d in mine]
            buffers = [jax.device_put(x, d) for x, d in zip(pieces, mine)]
            args.append(jax.make_array_from_single_device_arrays(
                pieces[0].shape, replicated, buffers))
        results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
        for o, per_device in enumerate(results):
            for buf in per_device:
                (dev,) = buf.devices()
                np.save(job / f"out_{o}_{partition_of[dev.id]}.npy", np.asarray(buf),
                        allow_pickle=False)
    if process_id == 0:
        (job / "outputs.json").write_text(json.dumps({"count": len(results)}))
