"""Slurm queues IPU jobs itself, on the real Slurm: the pod's IPUs are the licence `ipu`, a job's
--ipus=N asks for N of them (slurm/job_submit.lua), vipu-slurm-service keeps them equal to the IPUs
free, and a job whose free IPUs are scattered waits in vipu's queue instead of being requeued.

One IPU-Machine: a pod of 4 IPUs, as issue 19 asks for 20 one-IPU jobs to run 4 at a time."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.functional.harness import BIN, Pod, wait_until
from tests.functional.test_slurm import ENDED, World, vipu_conf
from tests.slurm import ROOT, SlurmCluster, build_spank_plugin
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

pytestmark = pytest.mark.functional

JOBS = 20


@pytest.fixture(scope="module")
def licensed_world(tmp_path_factory):
    plugin = build_spank_plugin()
    directory = tmp_path_factory.mktemp("slurm-licences")
    pod = Pod(directory, machines=1).start().register()
    ipuof_dir = directory / "shared-ipuof"
    wrappers = {f"{step}.sh": f"#!/bin/sh\nexport SLURM_CONF={{dir}}/slurm.conf VIPU_BIN={BIN} VIPU_SLURM_SOCKET={{dir}}/vipu-slurm.sock\n"
                              f"exec {ROOT}/slurm/vipu-slurm-{step}\n" for step in ("prolog", "epilog")}
    slurm = SlurmCluster(
        files={"vipu.conf": vipu_conf(pod.user_port, ipuof_dir, QueueTimeout="120"), **wrappers,
               "job_submit.lua": (ROOT / "slurm" / "job_submit.lua").read_text()},
        plugstack=f"required {plugin} conf={{dir}}/vipu.conf\n",
        extra_config="PrologSlurmctld={dir}/prolog.sh\nEpilogSlurmctld={dir}/epilog.sh\nLicenses=ipu:4\nJobSubmitPlugins=lua\n",
    )
    socket = slurm.directory / "vipu-slurm.sock"
    log_path = directory / "vipu-slurm-service.log"
    with open(log_path, "ab") as log:
        service = subprocess.Popen([str(BIN / "vipu-slurm-service"), "--socket", str(socket), "--conf",
                                    str(slurm.directory / "vipu.conf"), "--licences-interval", "0.3"],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SLURM_CONF": str(slurm.conf)})
    try:
        wait_until(socket.is_socket, what="vipu-slurm-service's socket")
        yield World(pod, slurm, ipuof_dir, directory)
    finally:
        service.terminate()
        service.wait(timeout=30)
        slurm.stop()
        pod.stop()


@pytest.fixture
def world(licensed_world):
    yield licensed_world
    licensed_world.cancel_submitted()
    for partition in licensed_world.partitions():
        licensed_world.pod.user("remove", "partition", partition)


def licence(world: World) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", world.slurm.run("scontrol", "show", "licenses", "ipu", "-o").stdout))


def reserved(world: World, count: int) -> None:
    wait_until(lambda: licence(world).get("Reserved") == str(count), what=f"{count} licences ipu reserved outside Slurm")


def queue(world: World, jobs: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (state, reason) of the jobs Slurm still knows."""
    listed = world.slurm.run("squeue", "-h", "-t", "all", "-o", "%i %T %r").stdout.split("\n")
    states = {fields[0]: (fields[1], fields[2]) for line in listed if len(fields := line.split(None, 2)) == 3}
    return {job: states[job] for job in jobs if job in states}


def test_twenty_one_ipu_jobs_on_a_four_ipu_pod_run_four_at_a_time_and_the_rest_wait_pending_for_licences(world):
    script = world.script("one-ipu", """
        #SBATCH --ipus 1
        echo "partition $IPUOF_VIPU_API_PARTITION_ID $(basename "$IPUOF_CONFIG_PATH")"
        sleep 1
        """)
    jobs = [world.submit(str(script)) for _ in range(JOBS)]
    most_started, most_partitions, waiting_for_licences, ever_started = 0, 0, set(), set()
    deadline = time.monotonic() + 180
    while True:
        seen = queue(world, jobs)
        started = [j for j, (state, _) in seen.items() if state in ("CONFIGURING", "RUNNING")]
        pending = {j for j, (state, reason) in seen.items() if state == "PENDING" and reason == "Licenses"}
        back_in_the_queue = {j for j, (state, _) in seen.items() if state == "PENDING"} & ever_started
        assert not back_in_the_queue, f"jobs requeued after they started: {back_in_the_queue}"
        ever_started |= set(started)
        most_started = max(most_started, len(started))
        most_partitions = max(most_partitions, len(world.partitions()))
        if len(started) == 4:
            waiting_for_licences |= pending
        if all(world.state(job) in ENDED for job in jobs):
            break
        assert time.monotonic() < deadline, f"the jobs did not all end: {seen}"
        time.sleep(0.2)
    assert most_started == 4 and most_partitions == 4
    # All but the first four wait PENDING (Licenses) while four run; a sample every 0.2 s may miss a short wait.
    assert len(waiting_for_licences) >= JOBS - 8 and not waiting_for_licences & set(jobs[:4]), waiting_for_licences
    for job in jobs:  # each had its partition and its IPUoF file (test_slurm.py attaches to them)
        assert world.output(job) == f"partition slurm-{job} slurm-{job}_ipuof.conf\n", world.output(job)
    controller_log = world.slurm.log("slurmctld")
    assert not [line for line in controller_log.splitlines() if "requeue" in line.lower()], "a job was requeued"
    world.nothing_left()


def test_ipus_held_outside_slurm_are_reserved_out_of_its_licences(world):
    assert world.pod.user("create", "partition", "by-hand", "--size", "2").code == 0
    reserved(world, 2)
    synced = subprocess.run([str(BIN / "vipu-slurm-licences"), "--conf", str(world.slurm.directory / "vipu.conf")],
                            capture_output=True, text=True, env=world.slurm.env, timeout=60)
    assert (synced.returncode, synced.stdout) == (
        0, "vipu-slurm-licences: 4 licences ipu; 2 IPUs held outside Slurm, reserved (vipu-outside)\n"), synced.stderr
    job = world.submit("--ipus=4", "--wrap", "true")
    wait_until(lambda: queue(world, [job]).get(job) == ("PENDING", "Licenses"), what="the job to wait for licences")
    assert world.partitions() == ["by-hand"]
    for licences in ("", "ipu:1"):  # its user cannot change the IPUs it counts
        changed = world.slurm.run("scontrol", "update", f"JobId={job}", f"Licenses={licences}")
        assert changed.returncode == 0, changed.stderr
        assert world.job(job)["Licenses"] == "ipu:4"
        wait_until(lambda: queue(world, [job]).get(job) == ("PENDING", "Licenses"), what="the job to wait for licences again")
    assert world.pod.user("remove", "partition", "by-hand").code == 0
    reserved(world, 0)
    world.wait_done(job, timeout=60)
    assert world.state(job) in ("COMPLETED", "GONE")


def test_a_job_whose_free_ipus_are_scattered_waits_in_vipus_queue_with_the_reason_and_is_not_requeued(world):
    api = vipuuser_pb2_grpc.UserServiceStub(world.pod._channel(world.pod.user_port))
    for name, ipu in (("h0", 0), ("h2", 2)):  # free: IPUs 1 and 3, no pair of them
        api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(
            id=name, size=1, cluster_id="cl0", ipus=[vipuuser_pb2.PartitionIpu(ipulink_domain_topology_id=0, topology_id=ipu)])))
    reserved(world, 2)
    job = world.submit("--ipus=2", "--wrap", "true")
    wait_until(lambda: world.comment(job).startswith("vipu: waiting for its IPUs:"), what="the job to wait in vipu's queue")
    assert world.comment(job) == ("vipu: waiting for its IPUs: first in the queue, ag1 IPUs 0-1 held for it; no free pair of IPUs "
                                  "in allocation alloc-1: 2 of 4 IPUs are free, the largest free group is 1 IPU (ag1 IPU 1); "
                                  "it fits when h0 or h2 is removed")
    assert world.state(job) == "CONFIGURING"  # its prolog waits; Slurm has given it its licences
    assert world.pod.user("remove", "partition", "h0").code == 0
    world.wait_done(job, timeout=60)
    assert world.job(job).get("Restarts", "0") == "0" and "requeued" not in world.comment(job)
