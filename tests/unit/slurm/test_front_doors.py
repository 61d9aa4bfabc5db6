"""The shell front doors slurm.conf names (slurm/vipu-slurm-prolog and -epilog): a job that asked
for no IPUs ends there without starting Python; one that asked goes on to vipu's program with its
environment and gets that program's exit status."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import threading

import pytest

from tests.slurm import ROOT
from tests.unit.slurm.test_jobs import Controller, Slurm
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.model.errors import InvalidArgument
from vipu.slurm.config import VipuSlurmConfig
from vipu.slurm.jobs import JobPartitions
from vipu.slurm.service import parse_request, serve


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


def test_the_prolog_and_epilog_import_no_cli_library():
    """slurmctld starts them for every job with IPUs: click's tens of milliseconds stay with vipu-slurm-check."""
    program = "import sys, vipu.slurm.main; print(sorted(m for m in sys.modules if m.startswith(('click', 'rich'))))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_running_service_does_the_work_without_the_program_and_its_absence_falls_back(tmp_path):
    """Through vipu-slurm-service (its real socket, the real nc.openbsd) with the controller and
    slurmctld as the doubles of test_jobs; once it is gone, the front door starts the program."""
    controller, slurm = Controller(), Slurm({"7": {"NumTasks": "2", "JobState": "CONFIGURING"}})
    user = UserClient(ClientSettings("localhost", 8090), 1.0)
    user.connection = controller  # type: ignore[assignment]
    config = VipuSlurmConfig(tmp_path / "vipu.conf", "ctl", tmp_path / "ipuof", max_ipus_per_job=16)
    socket = tmp_path / "run" / "slurm.sock"
    service = serve(socket, JobPartitions(config, slurm, user))
    threading.Thread(target=service.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    program = tmp_path / "bin" / "vipu-slurm-prolog"
    program.parent.mkdir()
    program.write_text('#!/bin/sh\necho "the program ran" >&2\nexit 3\n')
    program.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "VIPU_BIN": str(program.parent), "VIPU_SLURM_SOCKET": str(socket),
           "SLURM_JOB_ID": "7", "SPANK_VIPU_IPUS": "4"}

    def door(step: str, **changes: str) -> subprocess.CompletedProcess:
        return subprocess.run([ROOT / "slurm" / f"vipu-slurm-{step}"], env={**env, **changes}, capture_output=True, text=True,
                              timeout=30)

    try:
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600  # only slurmctld's user may ask
        created = door("prolog")
        assert (created.returncode, created.stderr) == (0, "")
        assert controller.partitions["slurm-7"].num_gcds == 2 and (tmp_path / "ipuof" / "slurm-7_gcd1_ipuof.conf").exists()
        removed = door("epilog")
        assert (removed.returncode, controller.partitions) == (0, {})
        controller.refuse["CreatePartition"] = [InvalidArgument("3 replicas do not divide evenly into 2 GCD(s)")]
        refused = door("prolog")
        assert refused.returncode == 1
        assert refused.stderr.startswith("vipu-slurm prolog (job 7): failed: cannot create partition slurm-7 of 4 IPUs")
        assert slurm.cancelled == ["7"]
    finally:
        service.shutdown()
        service.server_close()
    fallen_back = door("prolog")  # the socket is still there, but nothing answers it
    assert (fallen_back.returncode, fallen_back.stderr) == (3, "the program ran\n")


def test_requests_are_checked_before_anything_is_done():
    request = b"prolog\nSLURM_JOB_ID=7\nSPANK_VIPU_IPUS=4\nPATH=/x\n"  # only the job's own variables are taken
    assert parse_request(request) == ("prolog", {"SLURM_JOB_ID": "7", "SPANK_VIPU_IPUS": "4"})
    smuggled = b"epilog\nSLURM_JOB_ID=7\nSPANK_VIPU_IPUS=4\nSLURM_JOB_ID=123\nSPANK_VIPU_NUM_REPLICAS=\n"  # a value with a line break
    for bad in (b"", b"rm -rf\nSLURM_JOB_ID=7\n", b"epilog\nSLURM_JOB_ID=../7\n", smuggled):
        with pytest.raises(InvalidArgument):
            parse_request(bad)


def test_a_service_that_took_the_job_and_went_silent_fails_the_step_without_starting_the_program(tmp_path):
    """The work may be half done: Slurm requeues the job rather than two prologs racing."""
    path = tmp_path / "slurm.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def take_and_die():
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"working\n")

    threading.Thread(target=take_and_die, daemon=True).start()
    try:
        done = subprocess.run([ROOT / "slurm" / "vipu-slurm-prolog"], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "VIPU_BIN": str(tmp_path / "nowhere"), "VIPU_SLURM_SOCKET": str(path),
                                   "SLURM_JOB_ID": "8", "SPANK_VIPU_IPUS": "1"})
    finally:
        listener.close()
    assert (done.returncode, done.stderr) == (
        1, "vipu-slurm prolog (job 8): failed: vipu-slurm-service took the job and gave no answer\n")
