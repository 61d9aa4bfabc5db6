"""The IPUoF client proves a partition works, and refuses what it should, with the reason."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

from tests.functional.harness import BIN, Result, failed_line


def ipuof(pod, *args, env=None) -> Result:
    environment = {**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir), **(env or {})}
    done = subprocess.run([str(BIN / "vipu-ipuof"), "run", *args], capture_output=True, text=True, timeout=60, env=environment)
    return Result(done.returncode, done.stdout, done.stderr)


def test_the_client_runs_the_program_on_every_ipu_of_an_active_partition(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "16", "--num-gcds", "4").code == 0
    result = ipuof(pod, "--partition", "p1")
    assert (result.code, result.out) == (0, "run (p1): success. 16 IPUs in 4 GCD(s) ran the test program.\n"), result.err
    one = ipuof(pod, env={"IPUOF_CONFIG_PATH": str(pod.ipuof_dir / "p1_gcd2_ipuof.conf")})
    assert one.out == "run (p1): success. 4 IPUs in 1 GCD(s) ran the test program.\n"


def test_a_configuration_that_no_longer_matches_the_hardware_is_refused(registered_pod, tmp_path):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    stale = tmp_path / "p1_ipuof.conf"
    shutil.copy(pod.ipuof_dir / "p1_ipuof.conf", stale)
    assert pod.user("remove", "partition", "p1").code == 0
    failed_line(ipuof(pod, str(stale)), "run", "p1_ipuof.conf", "IPU 0 of m01 belongs to no partition")
    assert pod.user("create", "partition", "p2", "--size", "4").code == 0
    failed_line(ipuof(pod, str(stale)), "run", "p1_ipuof.conf", "IPU 0 of m01 belongs to another partition, not p1")
    failed_line(ipuof(pod, "--partition", "p1"), "run", "p1", "no IPUoF configuration of partition p1")


def test_a_kept_ipuof_file_opens_no_later_partition_of_its_name(registered_pod, tmp_path):
    """Each partition has an attach key of its own, in its IPUoF files: a file kept (or stolen) from
    a removed partition is refused by the same IPUs under a new partition of the same id."""
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    assert stat.S_IMODE((pod.ipuof_dir / "p1_ipuof.conf").stat().st_mode) == 0o600  # it holds the key
    stolen = tmp_path / "p1_ipuof.conf"
    shutil.copy(pod.ipuof_dir / "p1_ipuof.conf", stolen)
    keyless = tmp_path / "keyless" / "p1_ipuof.conf"
    keyless.parent.mkdir()
    document = json.loads(stolen.read_text())
    del document["attributes"]["Attach Key"]
    keyless.write_text(json.dumps(document))
    failed_line(ipuof(pod, str(keyless)), "run", "p1_ipuof.conf", "the attach key is not partition p1's")
    assert pod.user("remove", "partition", "p1").code == 0
    failed_line(ipuof(pod, str(stolen)), "run", "p1_ipuof.conf", "belongs to no partition")  # its partition is gone
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0  # the same id, on the same IPUs
    assert json.loads((pod.ipuof_dir / "p1_ipuof.conf").read_text())["devices"] == document["devices"]
    before = pod.snapshot()  # what the controller knows and every machine holds
    failed_line(ipuof(pod, str(stolen)), "run", "p1_ipuof.conf", "the attach key is not partition p1's")
    assert pod.snapshot() == before  # nothing changed
    assert ipuof(pod, "--partition", "p1").code == 0  # its own files work


def test_a_partition_in_error_cannot_be_used(registered_pod, tmp_path):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "8").code == 0
    shutil.copy(pod.ipuof_dir / "p1_ipuof.conf", tmp_path / "p1_ipuof.conf")
    pod.fault("m02", "IPU-Link training failed")
    assert pod.user("reset", "partition", "p1").code == 1  # now ERROR, and configured nowhere
    failed_line(ipuof(pod, str(tmp_path / "p1_ipuof.conf")), "run", "p1_ipuof.conf", "belongs to no partition")


def test_a_file_that_is_no_ipuof_configuration_is_refused(registered_pod, tmp_path):
    junk = tmp_path / "junk.conf"
    junk.write_text("{}")
    failed_line(ipuof(registered_pod, str(junk)), "run", "junk.conf", "is not an IPUoF configuration")
    usage = ipuof(registered_pod)
    failed_line(usage, "run", "?", "name a partition (--partition), its IPUoF files, or set IPUOF_CONFIG_PATH or")


def test_the_client_asks_the_controller_when_given_the_ipuof_vipu_api_variables(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "8", "--num-gcds", "2").code == 0
    api = {"IPUOF_VIPU_API_HOST": "127.0.0.1", "IPUOF_VIPU_API_PORT": str(pod.user_port), "IPUOF_VIPU_API_PARTITION_ID": "p1"}
    every = ipuof(pod, env=api)
    assert every.out == "run (p1): success. 8 IPUs in 2 GCD(s) ran the test program.\n", every.err
    one = ipuof(pod, env={**api, "IPUOF_VIPU_API_GCD_ID": "1"})
    assert one.out == "run (p1): success. 4 IPUs in 1 GCD(s) ran the test program.\n", one.err
    failed_line(ipuof(pod, env={**api, "IPUOF_VIPU_API_GCD_ID": "2"}), "run", "p1", "partition p1 has no GCD 2")
    failed_line(ipuof(pod, env={**api, "IPUOF_VIPU_API_PARTITION_ID": "p9"}), "run", "p9", "partition p9 does not exist")
    failed_line(ipuof(pod, env={**api, "IPUOF_VIPU_API_TIMEOUT": "soon"}), "run", "p1", "IPUOF_VIPU_API_TIMEOUT ('soon')")
