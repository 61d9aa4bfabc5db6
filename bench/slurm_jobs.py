"""What vipu costs Slurm's job throughput: jobs per second on a real slurmctld/slurmd, side by side.

On one node of Debian's Slurm (started by `tests.slurm`), `--jobs` trivial batch jobs are
submitted at once and timed from the first submission until the last has left the queue, in four
configurations, in the same run:

- plain: Slurm with nothing of vipu's;
- no IPUs, Python: vipu's SPANK plugin, and slurm.conf's PrologSlurmctld and EpilogSlurmctld
  naming vipu's Python programs directly (how vipu was set up before its shell front doors);
- no IPUs: the same with the shell front doors of `slurm/`, as the README sets it up;
- 1 IPU: the front doors, and every job asks for one IPU of a simulated pod with room for all;
- 1 IPU, through vipu-slurm-service: the same, with the service on the front doors' socket, so
  that no Python program starts per job.

Reported: jobs/s of each, and each as a share of plain Slurm's (the targets: 0.9 for jobs without
IPUs, 0.5 for 1-IPU jobs).

    python -m bench.slurm_jobs --jobs 40
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import click

from bench.common import running_pod, save, table
from tests.functional.harness import BIN
from tests.slurm import ROOT, SlurmCluster, build_spank_plugin


def throughput(slurm: SlurmCluster, jobs: int, options: list[str]) -> float:
    """Jobs per second: `jobs` trivial batch jobs submitted at once, until the last leaves the queue."""
    began = time.monotonic()
    for _ in range(jobs):
        done = slurm.run("sbatch", "--parsable", "-o", "/dev/null", *options, "--wrap", "true")
        if done.returncode != 0:
            raise click.ClickException(f"sbatch failed: {done.stderr.strip()}")
    deadline = began + 60 + 5 * jobs
    while slurm.run("squeue", "-h", "-o", "%i", timeout=30).stdout.strip():
        if time.monotonic() > deadline:
            raise click.ClickException(f"the jobs did not end in time; logs in {slurm.directory / 'log'}")
        time.sleep(0.05)
    return round(jobs / (time.monotonic() - began), 2)


def vipu_slurm(port: int, ipuof_dir, front_doors: bool) -> SlurmCluster:
    """A Slurm cluster with vipu's plugin, prolog and epilog, through the front doors or not; the
    front doors look for vipu-slurm-service at {dir}/vipu-slurm.sock."""
    programs = {step: ROOT / "slurm" / f"vipu-slurm-{step}" if front_doors else BIN / f"vipu-slurm-{step}"
                for step in ("prolog", "epilog")}
    scripts = {f"{step}.sh": f"#!/bin/sh\nexport SLURM_CONF={{dir}}/slurm.conf VIPU_BIN={BIN} VIPU_SLURM_SOCKET={{dir}}/vipu-slurm.sock\n"
                             f"exec {program}\n" for step, program in programs.items()}
    conf = f"ApiHost=127.0.0.1\nApiPort={port}\nIpuofDir={ipuof_dir}\n"
    return SlurmCluster(files={"vipu.conf": conf, **scripts}, plugstack=f"required {build_spank_plugin()} conf={{dir}}/vipu.conf\n",
                        extra_config="PrologSlurmctld={dir}/prolog.sh\nEpilogSlurmctld={dir}/epilog.sh\n")


@contextlib.contextmanager
def service_for(slurm: SlurmCluster) -> Iterator[None]:
    """vipu-slurm-service on the cluster's front doors' socket, for the length of the block."""
    socket = slurm.directory / "vipu-slurm.sock"
    with open(slurm.directory / "log" / "vipu-slurm-service.log", "ab") as log:
        service = subprocess.Popen([str(BIN / "vipu-slurm-service"), "--socket", str(socket), "--conf", str(slurm.directory / "vipu.conf")],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SLURM_CONF": str(slurm.conf)})
    try:
        deadline = time.monotonic() + 30
        while not socket.is_socket():
            if service.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"vipu-slurm-service did not start; its log is in {slurm.directory / 'log'}")
            time.sleep(0.05)
        yield
    finally:
        service.terminate()
        service.wait(timeout=30)


@click.command()
@click.option("--jobs", default=40, show_default=True, help="Jobs per configuration.")
@click.option("--name", default="slurm-jobs", show_default=True, help="Results file: bench/results/NAME.json.")
def main(jobs, name):
    """Slurm's jobs/s plain, with vipu for jobs without IPUs (before and after the front doors), and for 1-IPU jobs."""
    rates: dict[str, float] = {}
    plain = SlurmCluster()
    try:
        rates["plain Slurm"] = throughput(plain, jobs, [])
        version = plain.run("sinfo", "--version").stdout.strip()
    finally:
        plain.stop()
    with running_pod(max(4, -(-jobs // 4)), "sqlite") as pod:  # room for every 1-IPU job at once: none waits for IPUs
        for label, front_doors, options, served in (("no IPUs, Python prolog and epilog", False, [], False),
                                                    ("no IPUs", True, [], False), ("1 IPU each", True, ["--ipus=1"], False),
                                                    ("1 IPU each, vipu-slurm-service", True, ["--ipus=1"], True)):
            slurm = vipu_slurm(pod.user_port, pod.ipuof_dir, front_doors)
            try:
                with service_for(slurm) if served else contextlib.nullcontext():
                    rates[label] = throughput(slurm, jobs, options)
            finally:
                slurm.stop()
            click.echo(f"{label}: {rates[label]} jobs/s", err=True)
    shares = {label: round(rate / rates["plain Slurm"], 2) for label, rate in rates.items()}
    path = save(name, {"benchmark": "slurm-jobs", "slurm_version": version, "jobs": jobs, "jobs_per_s": rates,
                       "share_of_plain": shares})
    click.echo(table(["jobs", "jobs/s", "share of plain Slurm"], [[label, rate, shares[label]] for label, rate in rates.items()]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
