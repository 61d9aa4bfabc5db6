"""`vipu-slurm-prolog` and `vipu-slurm-epilog`: PrologSlurmctld and EpilogSlurmctld programs.

Slurm runs them without arguments, with the job in their environment (SLURM_JOB_ID, SLURM_CONF,
SPANK_VIPU_*). They read vipu.conf beside slurm.conf (VIPU_SLURM_CONF names another) and write
one line to standard error when something fails, exiting non-zero. They import only what they
use (no click): slurmctld starts one of them for every job with IPUs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from vipu.model.errors import VipuError
from vipu.slurm import config as slurm_config
from vipu.slurm.jobs import JobPartitions, Scontrol


def _config() -> slurm_config.VipuSlurmConfig:
    given = os.environ.get("VIPU_SLURM_CONF")
    return slurm_config.load(Path(given) if given else None)


def _run(what: str, action) -> None:
    logging.basicConfig(level=logging.INFO, format="vipu-slurm: %(message)s", stream=sys.stderr)
    job = os.environ.get("SLURM_JOB_ID", "?")
    try:
        try:
            config = _config()
        except VipuError as error:
            if what == "prolog" and os.environ.get("SPANK_VIPU_IPUS"):
                Scontrol().comment(job, f"vipu: {error.message}")  # the job waits, requeued, until it is fixed
            raise
        action(JobPartitions(config), os.environ)
    except VipuError as error:
        print(f"vipu-slurm {what} (job {job}): failed: {error.message}", file=sys.stderr)
        sys.exit(1)


def prolog() -> None:
    _run("prolog", lambda jobs, env: jobs.prolog(env))


def epilog() -> None:
    _run("epilog", lambda jobs, env: jobs.epilog(env))
