"""The shell front doors slurm.conf names (slurm/vipu-slurm-prolog and -epilog): a job that asked
for no IPUs ends there without starting Python; one that asked goes on to vipu's program with its
environment and gets that program's exit status."""

from __future__ import annotations

import subprocess

import pytest

from tests.slurm import ROOT


@pytest.mark.parametrize("step", ["prolog", "epilog"])
def test_only_a_job_with_ipus_reaches_the_program(step, tmp_path):
    program = tmp_path / f"vipu-slurm-{step}"
    program.write_text('#!/bin/sh\necho "$SPANK_VIPU_IPUS $SLURM_JOB_ID" > "$(dirname "$0")/ran"\nexit 3\n')
    program.chmod(0o755)
    door = ROOT / "slurm" / f"vipu-slurm-{step}"
    bare = {"PATH": "/usr/bin:/bin", "VIPU_BIN": str(tmp_path), "SLURM_JOB_ID": "17"}  # as slurmctld runs it

    plain = subprocess.run([door], env=bare, capture_output=True, text=True, timeout=10)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "", "")
    assert not (tmp_path / "ran").exists()

    asked = subprocess.run([door], env={**bare, "SPANK_VIPU_IPUS": "4"}, capture_output=True, text=True, timeout=10)
    assert asked.returncode == 3  # the program's own verdict
    assert (tmp_path / "ran").read_text() == "4 17\n"
