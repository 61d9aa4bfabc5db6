"""Obtaining accelerators from Slurm and from vipu, side by side, in the same run.

A real `slurmctld` and `slurmd` (Debian's, started by `tests.slurm`) offer one node with IPUs as
generic resources; a real `vipu-server` with a simulated pod offers the same number of IPUs. For
each size, the time to obtain that many accelerators is measured from the command line, as a
user would wait for it:

- Slurm: `salloc --no-shell --gres=ipu:N` returns once the allocation is granted;
- vipu: `vipu create partition --size N` returns once the partition is configured on its
  machines (ACTIVE) and its IPUoF files are written; and the same through the user API alone
  (`CreatePartition` over gRPC, as the Slurm plugin and the Kubernetes proxy call it), which
  leaves out the ~0.3 s a Python command spends starting up.

Each is released after each sample (`scancel`, `vipu remove partition`), outside the timing,
and the samples alternate so all see the same machine. Reported: medians, p90s and the ratios
of the medians (Slurm's time over vipu's).

    python -m bench.slurm_compare --sizes 1,4,16,64 --samples 20
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import click
import grpc

from bench.common import percentile, running_pod, save, split, table
from tests.functional.harness import BIN
from tests.slurm import SlurmCluster
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc


def timed(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return elapsed, done


def slurm_sample(slurm: SlurmCluster, ipus: int) -> float:
    elapsed, done = timed(["salloc", "--no-shell", f"--gres=ipu:{ipus}", "-n1", "-J", "bench"], slurm.env)
    job = next(word for line in done.stderr.splitlines() if "Granted job allocation" in line for word in line.split()[-1:])
    slurm.run("scancel", job)
    return elapsed


def vipu_sample(pod, ipus: int, number: int, env: dict[str, str]) -> float:
    name = f"bench{number}"
    user = [str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port)]
    elapsed, _ = timed([*user, "create", "partition", name, "--size", str(ipus)], env)
    timed([*user, "remove", "partition", name], env)
    return elapsed


def vipu_api_sample(api, ipus: int, number: int) -> float:
    name = f"api{number}"
    started = time.perf_counter()
    api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id=name, size=ipus)),
                        timeout=60)
    elapsed = time.perf_counter() - started
    api.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=name), timeout=60)
    return elapsed


def summary(seconds: list[float]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {"samples": len(ms), "median_ms": round(statistics.median(ms), 1), "p90_ms": round(percentile(ms, 0.9), 1)}


@click.command()
@click.option("--sizes", default="1,4,16,64", show_default=True, help="IPUs to obtain, comma separated.")
@click.option("--samples", default=20, show_default=True, help="Samples per size and system.")
@click.option("--machines", default=16, show_default=True, help="IPU-Machines in vipu's pod; Slurm's node gets as many IPUs.")
@click.option("--name", default="slurm-compare", show_default=True, help="Results file: bench/results/NAME.json.")
def main(sizes, samples, machines, name):
    """Time to obtain N accelerators: Slurm GRES allocation against vipu partition creation."""
    slurm = SlurmCluster(gres_ipus=machines * 4)
    try:
        with running_pod(machines, "sqlite") as pod:
            env = {**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)}
            api = vipuuser_pb2_grpc.UserServiceStub(grpc.insecure_channel(f"127.0.0.1:{pod.user_port}"))
            version = slurm.run("sinfo", "--version").stdout.strip()
            runs = []
            for ipus in map(int, split(sizes)):
                slurm_times, cli_times, api_times = [], [], []
                slurm_sample(slurm, ipus)  # warm every path once
                vipu_sample(pod, ipus, -1, env)
                vipu_api_sample(api, ipus, -1)
                for n in range(samples):
                    slurm_times.append(slurm_sample(slurm, ipus))
                    cli_times.append(vipu_sample(pod, ipus, n, env))
                    api_times.append(vipu_api_sample(api, ipus, n))
                s, c, a = summary(slurm_times), summary(cli_times), summary(api_times)
                runs.append({"ipus": ipus, "slurm": s, "vipu": c, "vipu_api": a,
                             "ratio": round(s["median_ms"] / c["median_ms"], 3), "ratio_api": round(s["median_ms"] / a["median_ms"], 3)})
                click.echo(f"{ipus:4} IPUs: Slurm {s['median_ms']} ms, vipu CLI {c['median_ms']} ms, API {a['median_ms']} ms", err=True)
    finally:
        slurm.stop()
    path = save(name, {"benchmark": "slurm-compare", "slurm_version": version, "machines": machines, "runs": runs})
    click.echo(table(["IPUs", "Slurm salloc ms", "p90", "vipu CLI ms", "p90", "vipu API ms", "p90", "Slurm/CLI", "Slurm/API"],
                     [[r["ipus"], r["slurm"]["median_ms"], r["slurm"]["p90_ms"], r["vipu"]["median_ms"], r["vipu"]["p90_ms"],
                       r["vipu_api"]["median_ms"], r["vipu_api"]["p90_ms"], r["ratio"], r["ratio_api"]] for r in runs]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
