"""The Slurm integration on a real Slurm: Debian's slurmctld and slurmd with munge, vipu's SPANK
plugin built from the repository, and the prolog and epilog against a real controller and pod.

Jobs run as root on this machine's one node. Each job's script records what its tasks saw and
attaches to its IPUs with `vipu-ipuof run`, the project's IPUoF client.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from tests.functional.harness import BIN, Pod, wait_until
from tests.slurm import ROOT, SlurmCluster, build_spank_plugin
from vipu.api.protos import admin_pb2, vipuuser_pb2, vipuuser_pb2_grpc
from vipu.slurm import config as slurm_config
from vipu.slurm.jobs import JobPartitions

pytestmark = pytest.mark.functional

MAX_IPUS = 16
MACHINES = 4  # 16 IPUs
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE")  # GONE: Slurm forgot the job


def vipu_conf(port: int, ipuof_dir: Path, **changes: str) -> str:
    settings = {"ApiHost": "127.0.0.1", "ApiPort": str(port), "IpuofDir": str(ipuof_dir), "MaxIpusPerJob": str(MAX_IPUS),
                "ApiTimeout": "10", **changes}
    return "# vipu's Slurm integration\n" + "".join(f"{key}={value}\n" for key, value in settings.items())


@pytest.fixture(scope="module")
def slurm_world(tmp_path_factory):
    plugin = build_spank_plugin()
    directory = tmp_path_factory.mktemp("slurm-pod")
    pod = Pod(directory, machines=MACHINES).start().register()
    ipuof_dir = directory / "shared-ipuof"
    # slurmctld gives its scripts a bare environment: this slurm.conf and vipu's programs are not
    # where they would look. The scripts then go through the repository's shell front doors, as
    # the README has an installation do.
    wrappers = {f"{step}.sh": f"#!/bin/sh\nexport SLURM_CONF={{dir}}/slurm.conf VIPU_BIN={BIN} VIPU_SLURM_SOCKET={{dir}}/vipu-slurm.sock\n"
                              f"exec {ROOT}/slurm/vipu-slurm-{step}\n" for step in ("prolog", "epilog")}
    slurm = SlurmCluster(
        files={"vipu.conf": vipu_conf(pod.user_port, ipuof_dir), **wrappers},
        plugstack=f"required {plugin} conf={{dir}}/vipu.conf\n",
        extra_config="PrologSlurmctld={dir}/prolog.sh\nEpilogSlurmctld={dir}/epilog.sh\n",
    )
    yield World(pod, slurm, ipuof_dir, directory)
    slurm.stop()
    pod.stop()


@pytest.fixture
def world(slurm_world):
    """The module's Slurm and pod; whatever jobs a test submitted are cancelled and gone, with
    their partitions, before the next test starts, even when the test failed half-way."""
    yield slurm_world
    slurm_world.cancel_submitted()


class World:
    def __init__(self, pod: Pod, slurm: SlurmCluster, ipuof_dir: Path, directory: Path):
        self.pod, self.slurm, self.ipuof_dir, self.directory = pod, slurm, ipuof_dir, directory
        self.jobs = directory / "jobs"
        self.jobs.mkdir()
        self.submitted: list[str] = []

    def script(self, name: str, body: str) -> Path:
        path = self.jobs / f"{name}.sh"
        path.write_text("#!/bin/bash\n" + textwrap.dedent(body).lstrip())
        return path

    def sbatch(self, *args: str) -> subprocess.CompletedProcess:
        done = self.slurm.run("sbatch", "--parsable", f"--chdir={self.jobs}", *args)
        if done.returncode == 0:
            self.submitted.append(done.stdout.strip().split(";")[0])
        return done

    def cancel_submitted(self) -> None:
        """Cancel every job this test submitted and wait until each has ended and its partition
        is gone. A job caught between two rounds of requeueing (COMPLETING) can miss a cancel and
        come back PENDING, so the cancel is sent again to whatever has not ended yet."""
        jobs, self.submitted = self.submitted, []

        def ended() -> bool:
            running = [job for job in jobs if self.state(job) not in ENDED or self.partitions_of(job)]
            if running:
                self.slurm.run("scancel", *running)
                time.sleep(0.5)
            return not running

        if jobs:
            wait_until(ended, timeout=90, what=f"jobs {', '.join(jobs)} to end and their partitions to go")

    def submit(self, *args: str) -> str:
        done = self.sbatch(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        out = self.slurm.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def comment(self, job_id: str) -> str:
        return self.slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%k").stdout.strip()

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "GONE")

    def wait_for(self, job_id: str, *states: str, timeout: float = 90) -> str:
        return wait_until(lambda: (s := self.state(job_id)) in states and s, timeout=timeout, what=f"job {job_id} to be {states}")

    def wait_done(self, job_id: str, timeout: float = 90) -> None:
        """Until the job and its epilog are over (Slurm forgets it MinJobAge after that)."""
        wait_until(lambda: self.state(job_id) in ENDED and not self.partitions_of(job_id), timeout=timeout,
                   what=f"job {job_id} to end and its partition to go")

    def partitions(self) -> list[str]:
        api = vipuuser_pb2_grpc.UserServiceStub(self.pod._channel(self.pod.user_port))
        return [p.id for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions]

    def partitions_of(self, job_id: str) -> list[str]:
        return [p for p in self.partitions() if p == f"slurm-{job_id}"]

    def assert_waiting(self, job_id: str) -> None:
        """The job is held back and has never run. A job whose PrologSlurmctld fails is requeued:
        it passes through CONFIGURING, COMPLETING and PENDING (REQUEUED for a moment), around
        and around, so any of these may be seen; its script never starts, so it wrote nothing."""
        assert self.state(job_id) in ("PENDING", "REQUEUED", "CONFIGURING", "COMPLETING")
        assert not (self.jobs / f"slurm-{job_id}.out").exists(), self.output(job_id)

    def output(self, job_id: str) -> str:
        return (self.jobs / f"slurm-{job_id}.out").read_text()

    def nothing_left(self) -> None:
        assert self.partitions() == []
        assert not self.ipuof_dir.exists() or list(self.ipuof_dir.iterdir()) == []
        assert all(held == {} for held in self.pod.snapshot()["held"].values())


# What each job's tasks record: the environment the plugin gave them, and an attach to their IPUs.
ATTACH = """\
    srun bash -c 'echo "task $SLURM_PROCID $IPUOF_VIPU_API_PARTITION_ID $IPUOF_VIPU_API_HOST:$IPUOF_VIPU_API_PORT \
        $IPUOF_CONFIG_PATH"; vipu-ipuof run'
"""


def tasks(output: str) -> dict[int, list[str]]:
    return {int(line.split()[1]): line.split()[2:] for line in output.splitlines() if line.startswith("task ")}


def test_a_job_script_gets_one_gcd_per_task_and_its_partition_goes_when_it_ends(world):
    script = world.script("multi", f"""
        #SBATCH --job-name multi-gcd-job
        #SBATCH --ipus 2
        #SBATCH -n 2
        export PATH={BIN}:$PATH
        echo "batch $IPUOF_VIPU_API_PARTITION_ID $IPUOF_CONFIG_PATH"
        {ATTACH}""")
    job = world.submit(str(script))
    world.wait_done(job)
    out = world.output(job)
    seen = tasks(out)
    partition = f"slurm-{job}"
    assert sorted(seen) == [0, 1]
    for rank, (name, address, config) in seen.items():
        assert name == partition and address == f"127.0.0.1:{world.pod.user_port}"
        assert config == str(world.ipuof_dir / f"{partition}_gcd{rank}_ipuof.conf")
    assert out.count("success. 1 IPUs in 1 GCD(s)") == 2, out  # each task attached to its own GCD
    assert f"batch {partition} " in out
    assert world.comment(job) in ("", f"vipu: partition {partition}")  # empty once Slurm forgot the job
    world.nothing_left()


def test_the_seed_command_line_and_srun_work_too(world):
    script = world.script("plain", f"""
        export PATH={BIN}:$PATH
        {ATTACH}""")
    job = world.submit("--ipus=4", "--ntasks=1", "--num-replicas=1", str(script))
    world.wait_done(job)
    seen = tasks(world.output(job))
    assert seen[0][0] == f"slurm-{job}" and seen[0][2] == str(world.ipuof_dir / f"slurm-{job}_ipuof.conf")
    assert "success. 4 IPUs in 1 GCD(s)" in world.output(job)

    done = world.slurm.run("srun", "--ipus=1", "-n1", "bash", "-c", f"echo $IPUOF_VIPU_API_PARTITION_ID; {BIN}/vipu-ipuof run")
    assert done.returncode == 0, done.stderr
    name = done.stdout.splitlines()[0]
    assert name.startswith("slurm-") and "success. 1 IPUs in 1 GCD(s)" in done.stdout
    wait_until(lambda: world.partitions() == [], what="srun's partition to go")
    world.nothing_left()


@pytest.mark.parametrize("options,reason", [
    (["--ipus=3"], "vipu: --ipus must be a power of two (1, 2, 4, 8, ...), not 3"),
    (["--ipus=32"], f"vipu: --ipus=32 is more than the {MAX_IPUS} IPUs a job may have (MaxIpusPerJob in"),
    (["--ipus=two"], "vipu: --ipus needs a positive whole number of IPUs, not 'two'"),
    (["--num-replicas=2"], "vipu: --num-replicas needs --ipus"),
])
def test_an_impossible_request_is_refused_at_submission(world, options, reason):
    before = set(world.slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split())
    done = world.sbatch(*options, "--wrap", "true")
    assert done.returncode != 0
    assert reason in done.stderr, done.stderr
    assert set(world.slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()) <= before  # no job was made
    world.nothing_left()


def end_by(world, how: str, *options: str) -> str:
    script = world.script(f"end-{how}", "echo started\nsleep 300\n")
    job = world.submit("--ipus=2", *options, str(script))
    world.wait_for(job, "RUNNING")
    wait_until(lambda: world.partitions_of(job), what=f"the partition of job {job}")
    return job


def test_the_partition_goes_however_the_job_ends(world):
    failing = world.submit("--ipus=1", "--wrap", "exit 3")
    cancelled = end_by(world, "scancel")
    world.slurm.run("scancel", cancelled)
    timed_out = world.submit("--ipus=1", "--time=0:01", "--wrap", "sleep 300")  # Slurm's limits count whole minutes
    for job in (failing, cancelled):
        world.wait_done(job)
    world.wait_for(timed_out, "RUNNING")
    assert world.partitions_of(timed_out)
    world.wait_done(timed_out, timeout=150)
    world.nothing_left()


def test_a_jobs_partition_is_expected_to_run_for_the_jobs_time_limit_and_is_labelled_with_the_job(world):
    limited = world.submit("--ipus=1", "--time=1-01:30:00", "--wrap", "sleep 300")
    unlimited = world.submit("--ipus=1", "--wrap", "sleep 300")  # the cluster's partition has no limit
    api = vipuuser_pb2_grpc.UserServiceStub(world.pod._channel(world.pod.user_port))
    for job, seconds in ((limited, 86400 + 5400), (unlimited, 0)):
        world.wait_for(job, "RUNNING")
        status = api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id=f"slurm-{job}")).status
        assert status.expected_seconds == seconds, world.job(job).get("TimeLimit")
        assert dict(status.labels) == {"slurm_job": job}  # what its IPUs' telemetry is labelled with
    world.slurm.run("scancel", limited, unlimited)
    for job in (limited, unlimited):
        world.wait_done(job)
    world.nothing_left()


def test_a_job_in_a_slurm_reservation_vipu_has_too_gets_its_partition_there_and_hears_of_drains(world, monkeypatch):
    api = vipuuser_pb2_grpc.UserServiceStub(world.pod._channel(world.pod.user_port))

    def machines(job: str) -> set[str]:
        [partition] = [p for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions if p.id == f"slurm-{job}"]
        return {ipu.agent_id for ipu in partition.spec.ipus}

    now = time.time()
    world.pod.admin_api.CreateReservation(admin_pb2.CreateReservationRequest(
        name="team", agent_ids=["ag3", "ag4"], start=now, end=now + 3600, reason="a team's slot", users=["slurm"]))
    try:
        outside = world.submit("--ipus=8", "--wrap", "sleep 300")  # the reservation's IPUs are kept from it
        world.wait_for(outside, "RUNNING")
        # Slurm's side of it (its one node reserved, the job already there left running), named as vipu's.
        made = world.slurm.run("scontrol", "create", "reservation", "ReservationName=team", "StartTime=now", "Duration=60",
                               "Users=root", f"Nodes={world.slurm.node}", "Flags=IGNORE_JOBS")
        assert made.returncode == 0, made.stderr
        inside = world.submit("--reservation=team", "--ipus=8", "--wrap", "sleep 300")
        world.wait_for(inside, "RUNNING")
        assert machines(inside) == {"ag3", "ag4"} and machines(outside) == {"ag1", "ag2"}
        world.pod.admin_api.DrainAgents(admin_pb2.DrainAgentsRequest(agent_ids=["ag1"], reason="cable repair"))
        monkeypatch.setenv("SLURM_CONF", str(world.slurm.conf))  # the upkeep of vipu-slurm-service, as it runs it
        JobPartitions(slurm_config.load(world.slurm.directory / "vipu.conf")).tell_drains()
        assert world.comment(outside).startswith(f"vipu: partition slurm-{outside}: agent ag1 is draining for cable repair")
        assert world.comment(inside) == f"vipu: partition slurm-{inside}"  # as its prolog left it
    finally:
        world.cancel_submitted()  # first: Slurm keeps a reservation a job runs in
        deleted = world.slurm.run("scontrol", "delete", "ReservationName=team")
        with contextlib.suppress(grpc.RpcError):
            world.pod.admin_api.ResumeAgents(admin_pb2.ResumeAgentsRequest(agent_ids=["ag1"]))
        world.pod.admin_api.RemoveReservation(admin_pb2.RemoveRequest(id="team"))
    assert deleted.returncode == 0 or "not found" in deleted.stderr.lower(), deleted.stderr  # the node is the next tests' again


def test_a_node_failure_ends_the_job_and_its_partition(world):
    job = end_by(world, "node", "--no-requeue")  # else Slurm would requeue it, and the prolog run again
    node = world.slurm.node
    world.slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=vipu-test")
    try:
        world.wait_done(job)
    finally:
        world.slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        wait_until(lambda: world.slurm.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", what="the node back")
    world.nothing_left()


def test_a_job_waits_with_a_reason_while_the_controller_is_down_or_full(world):
    """Without the licences of test_slurm_queue.py, Slurm starts a job the pod has no room for: its
    prolog waits in vipu's queue (QueueTimeout), the reason in its comment, and the job runs once
    room appears, never requeued."""
    holder = world.submit("--ipus=16", "--wrap", "sleep 300")
    world.wait_for(holder, "RUNNING")
    full = world.submit("--ipus=8", "--wrap", "true")
    wait_until(lambda: world.comment(full).startswith("vipu: waiting for its IPUs: first in the queue, ag1-ag2 held for it; "
                                                      "no free 8-IPU run in allocation alloc-1"), timeout=60, what="the full pod's reason")
    world.assert_waiting(full)
    assert world.partitions() == [f"slurm-{holder}"]
    api = vipuuser_pb2_grpc.UserServiceStub(world.pod._channel(world.pod.user_port))
    assert [r.partition_id for r in api.ListQueued(vipuuser_pb2.ListQueuedRequest()).requests] == [f"slurm-{full}"]
    world.slurm.run("scancel", holder)
    world.wait_done(full)
    said = [line for line in world.slurm.log("slurmctld").splitlines() if line.endswith(f" for JobId={full}")]
    assert said and not [line for line in said if "requeued" in line], said  # it waited; its prolog never failed
    world.cancel_submitted()

    world.pod.stop_server()
    try:
        down = world.submit("--ipus=2", "--wrap", "true")
        wait_until(lambda: "unreachable" in world.comment(down), what="the unreachable controller's reason")
        world.assert_waiting(down)
        world.slurm.run("scancel", down)  # the fixture waits for it to end once the server is back
    finally:
        world.pod.start_server()
    world.nothing_left()


def test_concurrent_jobs_of_different_sizes_each_get_and_release_their_partition(world):
    jobs = {}
    for n, (ipus, gcds) in enumerate([(1, 1), (2, 2), (4, 1), (4, 4), (2, 1), (1, 1)]):
        script = world.script(f"concurrent{n}", f"""
            #SBATCH --ipus {ipus}
            #SBATCH -n {gcds}
            export PATH={BIN}:$PATH
            {ATTACH}""")
        jobs[world.submit(str(script))] = (ipus, gcds)
    for job in jobs:
        world.wait_done(job, timeout=180)
    for job, (ipus, gcds) in jobs.items():
        out = world.output(job)
        seen = tasks(out)
        assert sorted(seen) == list(range(gcds)), out
        assert {name for name, _, _ in seen.values()} == {f"slurm-{job}"}
        assert out.count("success.") == gcds, out
        assert f"{ipus // gcds} IPUs in 1 GCD(s)" in out, out
    world.nothing_left()


def test_vipu_slurm_service_does_the_work_of_jobs_with_ipus_and_leaves_nothing(world):
    """With vipu-slurm-service on the front doors' socket, no Python program starts per job; the
    jobs run on their partitions just the same, and the service's log shows it did the work."""
    socket = world.slurm.directory / "vipu-slurm.sock"
    log_path = world.directory / "vipu-slurm-service.log"
    with open(log_path, "ab") as log:
        service = subprocess.Popen([str(BIN / "vipu-slurm-service"), "--socket", str(socket),
                                    "--conf", str(world.slurm.directory / "vipu.conf")], stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "SLURM_CONF": str(world.slurm.conf)})
    try:
        wait_until(socket.is_socket, what="vipu-slurm-service's socket")
        jobs = []
        for n, ipus in enumerate((1, 2, 4)):
            script = world.script(f"served{n}", f"""
                #SBATCH --ipus {ipus}
                export PATH={BIN}:$PATH
                {ATTACH}""")
            jobs.append(world.submit(str(script)))
        for job in jobs:
            world.wait_done(job, timeout=120)
            assert "success." in world.output(job)
        world.nothing_left()
        served = log_path.read_text()
        for job, ipus in zip(jobs, (1, 2, 4), strict=True):
            assert f"job {job}: partition slurm-{job} of {ipus} IPUs" in served, served
            assert f"job {job}: partition slurm-{job} removed" in served, served
    finally:
        service.terminate()
        service.wait(timeout=30)
    assert not socket.exists()  # gone with the service: the front doors start the programs again


def test_jobs_of_a_slurm_account_are_held_to_its_vipu_quota_with_what_other_front_ends_hold(world):
    """vipu.conf's Accounts=same: a job's partition is made on the vipu account of its Slurm account
    (sbatch -A). A partition another front-end made on that account (as the Kubernetes proxy makes
    an IPUJob's) counts against the same quota: a Slurm job over it waits in vipu's queue saying
    so, and runs once the quota has room."""
    conf = world.slurm.directory / "vipu.conf"
    good = conf.read_text()
    try:
        conf.write_text(good + "Accounts=same\n")
        made = world.pod.admin("create", "account", "physics", "--quota", "8")
        assert made.code == 0, made.err
        assert world.pod.user("create", "partition", "from-kubernetes", "--size", "4", "--account", "physics").code == 0
        first = world.submit("-A", "physics", "--ipus=4", "--wrap", "sleep 300")
        world.wait_for(first, "RUNNING")
        over = world.submit("-A", "physics", "--ipus=4", "--wrap", "true")
        wait_until(lambda: world.comment(over).startswith("vipu: waiting for its IPUs: waits for its account's quota: account "
                                                          "physics holds 8 of its quota of 8 IPUs in allocation alloc-1"),
                   timeout=60, what="the job over its account's quota to say so")
        world.assert_waiting(over)
        api = vipuuser_pb2_grpc.UserServiceStub(world.pod._channel(world.pod.user_port))
        status = api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id=f"slurm-{first}")).status
        assert status.account == "physics"
        assert world.pod.user("remove", "partition", "from-kubernetes").code == 0
        world.wait_done(over)  # room in its quota: it ran
        assert "RUNNING" in world.state(first)
    finally:
        conf.write_text(good)
        world.cancel_submitted()
        world.pod.user("remove", "partition", "from-kubernetes")
        world.pod.admin("remove", "account", "physics")
    world.nothing_left()


def test_a_broken_vipu_conf_refuses_jobs_and_says_why(world):
    conf = world.slurm.directory / "vipu.conf"
    good = conf.read_text()
    try:
        conf.write_text("ApiHost 127.0.0.1\n")
        done = world.sbatch("--ipus=2", "--wrap", "true")
        assert done.returncode != 0
        assert f"vipu: {conf} line 1: expected Key=Value, found 'ApiHost 127.0.0.1'" in done.stderr
        conf.unlink()
        done = world.sbatch("--ipus=2", "--wrap", "true")
        assert done.returncode != 0 and f"vipu: cannot read {conf}: No such file or directory" in done.stderr
        check = subprocess.run([str(BIN / "vipu-slurm-check"), str(conf)], capture_output=True, text=True)
        assert check.returncode == 1
        assert check.stderr.strip() == f"vipu-slurm-check ({conf}): failed: cannot read {conf}: No such file or directory"
    finally:
        conf.write_text(good)
    check = subprocess.run([str(BIN / "vipu-slurm-check"), str(conf)], capture_output=True, text=True)
    assert check.returncode == 0 and "answers" in check.stdout
    world.nothing_left()


def test_slurmd_says_in_its_log_at_start_when_vipu_conf_is_unusable():
    plugin = build_spank_plugin()
    slurm = SlurmCluster(files={"vipu.conf": "ApiHost=ctl\nApiPort=eighty\n"}, plugstack=f"required {plugin} conf={{dir}}/vipu.conf\n")
    try:
        logged = [line for line in slurm.log("slurmd").splitlines() if "vipu:" in line]
        expected = f"error: vipu: {slurm.directory / 'vipu.conf'} line 2: ApiPort must be a positive whole number, not 'eighty'"
        assert logged and logged[0].endswith(expected)
    finally:
        slurm.stop()
