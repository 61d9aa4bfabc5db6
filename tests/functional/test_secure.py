"""Secure mode: mutual TLS, users with access keys, tenants kept apart, and every refusal named."""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.functional.harness import (
    BIN,
    PROMPTLY,
    Pod,
    Result,
    failed_line,
    hears,
    pairs,
    rows,
    wait_until,
    watching,
)
from tests.ports import free_port
from vipu.api.protos import admin_pb2, agent_pb2, agent_pb2_grpc
from vipu.api.tls import TlsFiles, agent_channel_credentials, generate, issue
from vipu.client import Unauthenticated, Unavailable, UserClient
from vipu.client.settings import parse_hcl


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory):
    pod = Pod(tmp_path_factory.mktemp("secure"), machines=4, secure=True).start()
    yield pod
    pod.stop()


@pytest.fixture
def tenants(pod):
    """Allocations a1 (ag1, ag2) and a2 (ag3, ag4); alice and bob share a1, carol has a2."""
    pod.register(allocation="")
    api = pod.admin_api
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="a1", cluster_id="cl0", agent_ids=["ag1", "ag2"]))
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="a2", cluster_id="cl0", agent_ids=["ag3", "ag4"]))
    for user, allocation in (("alice", "a1"), ("bob", "a1"), ("carol", "a2")):
        created = pod.admin("create", "user", user, "--allocations", allocation)
        assert created.code == 0, created.err
    return {user: pod.directory / f"{user}.vipu-cli.hcl" for user in ("alice", "bob", "carol")}


def key_of(config) -> str:
    return str(parse_hcl(config.read_text(), str(config))["api-access-key"])


def test_init_makes_the_store_the_certificates_and_an_administrator(tmp_path):
    done = subprocess.run([str(BIN / "vipu-server"), "--init", "--secure", "--db", f"sqlite:///{tmp_path / 'v.db'}",
                           "--default-user-id", "ops"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0] == f"Initialised storage: sqlite:///{tmp_path / 'v.db'}"
    assert lines[1:5] == ["Generated server TLS certificates in the directory: vipu-certs/server",
                          "Generated client TLS certificates in the directory: vipu-certs/client",
                          "Generated agent link TLS certificates in the directories: vipu-certs/agents, vipu-certs/controller",
                          "Default user is: ops"]
    assert lines[5].startswith("Access key is '") and lines[6].endswith("written: ops.vipu-cli.hcl")
    files = TlsFiles(tmp_path / "vipu-certs")
    for private in (files.ca_key, files.server_key, files.client_key, files.link_ca_key, files.agent_key, files.controller_key,
                    tmp_path / "ops.vipu-cli.hcl"):
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600, private
    again = subprocess.run([str(BIN / "vipu-server"), "--tls-init"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.splitlines()) == 1


def test_a_secure_controller_without_the_agent_links_certificates_refuses_to_start(tmp_path):
    """A TLS directory made before the agent link had certificates of its own: rather than reach
    the agents in plaintext, the controller stops in one line naming the command that makes them."""
    db = f"sqlite:///{tmp_path / 'v.db'}"
    made = subprocess.run([str(BIN / "vipu-server"), "--init", "--secure", "--db", db, "--default-user-id", "ops"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert made.returncode == 0, made.stderr
    for made_since in ("controller", "agents"):  # as a directory made before the agent link had certificates of its own
        shutil.rmtree(tmp_path / "vipu-certs" / made_since)
    started = subprocess.run([str(BIN / "vipu-server"), "--secure", "--db", db, "--port", str(free_port()),
                              "--admin-port", str(free_port()), "--metrics-port", "0"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert started.returncode == 2
    assert started.stderr.splitlines() == [
        "vipu-server: secure mode needs the agent link's certificate in vipu-certs/controller, and its agents those in "
        "vipu-certs/agents; 'vipu-server --init --secure --tls-dir vipu-certs' makes them"]
    mended = subprocess.run([str(BIN / "vipu-server"), "--init", "--secure", "--db", db], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)  # as the refusal says: the other certificates and the users are kept
    assert mended.stdout.splitlines()[1:] == [
        "Using the TLS certificates in the directory: vipu-certs",
        "Generated agent link TLS certificates in the directories: vipu-certs/agents, vipu-certs/controller",
        "An administrator exists already; no default user was created."], mended.stdout


def test_users_get_a_key_once_and_a_configuration_file_that_works(pod, tenants):
    config = parse_hcl(tenants["alice"].read_text(), "alice")
    assert (config["api-user-id"], config["api-port"], config["api-host"]) == ("alice", pod.user_port, "127.0.0.1")
    assert stat.S_IMODE(os.stat(tenants["alice"]).st_mode) == 0o600
    assert pod.user("create", "partition", "p1", "--size", "4", config=tenants["alice"]).code == 0
    assert rows(pod.admin("list", "users").out) == [["admin", "admin", "-"], ["alice", "user", "a1"], ["bob", "user", "a1"],
                                                      ["carol", "user", "a2"]]
    # The same credentials by flag, and the host from the environment.
    tls = pod.tls
    done = subprocess.run(
        [str(BIN / "vipu"), "--api-port", str(pod.user_port), "--api-user-id", "alice", "--api-access-key", key_of(tenants["alice"]),
         "--tls-server-cert", str(tls.ca_for(tls.client_dir)), "--tls-client-cert", str(tls.client_cert),
         "--tls-client-key", str(tls.client_key), "list", "partitions"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VIPU_CLI_API_HOST": "127.0.0.1"},
    )
    assert done.returncode == 0 and [r[0] for r in rows(done.stdout)] == ["p1"], done.stderr


def test_tenants_see_and_touch_only_what_is_given_to_them(pod, tenants):
    alice, bob, carol = tenants["alice"], tenants["bob"], tenants["carol"]
    assert pod.user("create", "partition", "pa", "--size", "8", config=alice).code == 0
    assert pod.held_anywhere("pa") == ["m01", "m02"]
    # Users sharing an allocation see each other's partitions and may reset them, but not remove them.
    assert [r[0] for r in rows(pod.user("list", "partitions", config=bob).out)] == ["pa"]
    assert pod.user("reset", "partition", "pa", config=bob).code == 0
    before = pod.snapshot()
    failed_line(pod.user("remove", "partition", "pa", config=bob), "remove partition", "pa",
                "partition pa belongs to user alice; only its owner or an administrator removes it")
    # Two users waiting in one allocation: each sees the queue, only its owner (or an administrator) cancels a request.
    waiting = subprocess.Popen([str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port), "--config", str(bob),
                                "create", "partition", "pb", "--size", "4", "--wait", "--timeout", "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=pod.directory,
                               env={**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)})
    wait_until(lambda: [r[1] for r in rows(pod.user("list", "requests", config=alice).out)] == ["pb"], what="bob's request")
    assert [r[:5] for r in rows(pod.user("list", "requests", config=alice).out)] == [["1", "pb", "a1", "4", "bob"]]
    assert rows(pod.user("list", "requests", config=carol).out) == []
    failed_line(pod.user("remove", "request", "pb", config=alice), "remove request", "pb",
                "the request of partition pb is user bob's; only its owner or an administrator cancels it")
    failed_line(pod.user("remove", "request", "pb", config=carol), "remove request", "pb", "no request of partition pb waits")
    assert pod.user("remove", "request", "pb", config=bob).code == 0
    assert waiting.wait(timeout=30) == 1 and "the request of partition pb was cancelled by bob" in waiting.stderr.read()
    # Another tenant sees nothing of it and can touch none of it.
    assert rows(pod.user("list", "partitions", config=carol).out) == []
    assert [r[0] for r in rows(pod.user("list", "allocations", config=carol).out)] == ["a2"]
    failed_line(pod.user("get", "partition", "pa", config=carol), "get partition", "pa", "partition pa does not exist")  # as if
    failed_line(pod.user("reset", "partition", "pa", config=carol), "reset partition", "pa", "partition pa does not exist")
    failed_line(pod.user("create", "partition", "pc", "--size", "4", "--allocation", "a1", config=carol),
                "create partition", "pc", "allocation a1 is not given to user carol")
    attrs = rows(pod.user("list", "ipu-attrs", config=carol).out)
    assert {r[0] for r in attrs if r[0]} == {"ag3", "ag4"}
    assert pod.snapshot() == before
    # Carol's own partitions come from her allocation; an administrator removes anyone's.
    assert pod.user("create", "partition", "pc", "--size", "4", config=carol).code == 0
    assert pod.held_anywhere("pc") == ["m03"]
    assert pod.user("remove", "partition", "pa").code == 0


def test_only_its_owner_or_an_administrator_changes_a_partitions_consent_to_be_moved(pod, tenants):
    alice, bob, carol = tenants["alice"], tenants["bob"], tenants["carol"]
    assert pod.user("create", "partition", "pa", "--size", "4", "--may-move", config=alice).code == 0
    before = pod.snapshot()
    failed_line(pod.user("update", "partition", "pa", "--no-may-move", config=bob), "update partition", "pa",
                "partition pa belongs to user alice; only its owner or an administrator changes it")
    failed_line(pod.user("update", "partition", "pa", "--no-may-move", config=carol), "update partition", "pa",
                "partition pa does not exist")  # another tenant's, as if it did not exist
    assert pod.snapshot() == before
    assert pairs(pod.user("get", "partition", "pa", config=bob).out)["May move"] == "yes"
    assert pod.user("update", "partition", "pa", "--no-may-move", config=alice).code == 0
    assert pairs(pod.user("get", "partition", "pa", config=bob).out)["May move"] == "no"
    assert pod.user("update", "partition", "pa", "--may-move").code == 0  # the administrator
    assert pairs(pod.user("get", "partition", "pa", config=alice).out)["May move"] == "yes"


def test_a_watch_of_changes_tells_each_user_only_what_they_may_see_and_ends_with_their_user(pod, tenants):
    alice, carol = (UserClient.connect(config=tenants[user]) for user in ("alice", "carol"))
    try:
        alice_heard, alice_watch = watching(alice)
        carol_heard, carol_watch = watching(carol)
        assert pod.user("create", "partition", "pa", "--size", "4", config=tenants["alice"]).code == 0
        assert hears(alice_heard, "partitions")
        assert pod.admin("update", "user", "bob", "--give", "a2").code == 0
        # Had carol heard of alice's partition, its message would have come before this one.
        while not (topics := carol_heard.get(timeout=PROMPTLY)):
            pass
        assert topics == ["users"]
        assert carol_heard.get(timeout=PROMPTLY) is None  # and after a change of users the watch ends
        with pytest.raises(Unauthenticated, match="invalid user id or access key for user carol"):
            list(UserClient.connect(config=tenants["carol"], access_key="wrong-key-wrong-key1").watch_changes())
    finally:
        alice_watch.cancel()
        carol_watch.cancel()
        alice.close()
        carol.close()


def test_a_user_watches_at_most_twice_at_once_and_a_cancelled_watch_frees_its_place_at_once(pod, tenants):
    alice, bob = (UserClient.connect(config=tenants[user]) for user in ("alice", "bob"))
    streams = []

    def placed(client: UserClient) -> bool:
        stream = client.watch_changes()
        try:
            next(iter(stream))
        except Unavailable:
            return False
        streams.append(stream)
        return True

    try:
        assert placed(alice) and placed(alice)
        with pytest.raises(Unavailable, match="user alice watches this controller's changes 2 times already, as often as one user"):
            next(iter(alice.watch_changes()))
        assert placed(bob)  # a share of his own
        streams[0].cancel()
        # Well within the 10 s heartbeat, the first time the watch would otherwise have looked.
        wait_until(lambda: placed(alice), timeout=PROMPTLY, what="the cancelled watch's place")
    finally:
        for stream in streams:
            stream.cancel()
        alice.close()
        bob.close()


def test_every_refusal_names_its_cause_and_changes_nothing(pod, tenants, tmp_path):
    alice = tenants["alice"]
    assert pod.user("create", "partition", "p1", "--size", "4", config=alice).code == 0
    before, counted_before = pod.snapshot(), pod.metrics()
    tls = pod.tls

    plain = subprocess.run([str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port), "list", "partitions"],
                           capture_output=True, text=True, timeout=60)
    failed_line(Result(plain.returncode, plain.stdout, plain.stderr), "list partitions", None,
                "closed the connection: it runs in secure mode and needs mutual TLS")

    foreign = TlsFiles(tmp_path / "other")
    generate(foreign, ["localhost"])
    failed_line(pod.user("--tls-client-cert", str(foreign.client_cert), "--tls-client-key", str(foreign.client_key),
                         "list", "partitions", config=alice),
                "list partitions", None, "does not accept the client certificate")
    failed_line(pod.user("--tls-server-cert", str(foreign.ca_for(foreign.client_dir)), "list", "partitions", config=alice),
                "list partitions", None, "its certificate is not signed by the certificate authority in")
    failed_line(pod.user("--tls-client-key", str(tls.server_key), "list", "partitions", config=alice),
                "list partitions", None, f"the client key {tls.server_key} does not belong to the client certificate")
    failed_line(pod.user("--tls-client-cert", str(tls.server_cert), "--tls-client-key", str(tls.server_key), "list", "partitions",
                         config=alice),
                "list partitions", None, f"the client certificate {tls.server_cert} is not made for client authentication")

    now = datetime.datetime.now(datetime.UTC)
    key, cert = issue(tls.ca_key.read_bytes(), tls.ca_cert.read_bytes(), "stale",
                      not_before=now - datetime.timedelta(days=30), not_after=now - datetime.timedelta(days=1))
    (tmp_path / "stale.pem").write_bytes(cert)
    (tmp_path / "stale-key.pem").write_bytes(key)
    failed_line(pod.user("--tls-client-cert", str(tmp_path / "stale.pem"), "--tls-client-key", str(tmp_path / "stale-key.pem"),
                         "list", "partitions", config=alice),
                "list partitions", None, f"the client certificate {tmp_path / 'stale.pem'} expired on")

    failed_line(pod.user("--api-access-key", "not-the-key", "list", "partitions", config=alice),
                "list partitions", None, "invalid user id or access key for user alice")
    assert "not-the-key" not in pod.logged("authentication of user 'alice' from ipv4:127.0.0.1:")
    old_key = key_of(alice)
    assert pod.admin("update", "user", "alice", "--rotate-key").code == 0
    failed_line(pod.user("--api-access-key", old_key, "list", "partitions", config=alice),
                "list partitions", None, "invalid user id or access key for user alice")
    assert pod.user("list", "partitions", config=alice).code == 0  # the rewritten file holds the new key

    failed_line(pod.admin("list", "agents", config=alice), "list agents", None,
                "user alice is not an administrator; the admin end-point answers administrators only")
    alone = subprocess.run([str(BIN / "vipu-admin"), "--config", str(alice), "list", "agents"], capture_output=True, text=True,
                           timeout=60)  # the user's file names this controller's admin port too, not the default 8091
    failed_line(Result(alone.returncode, alone.stdout, alone.stderr), "list agents", None, "user alice is not an administrator")
    failed_line(pod.admin("create", "user", "mallory", "--admin", config=alice), "create user", "mallory", "not an administrator")
    failed_line(pod.user("remove", "partition", "p1", config=tenants["carol"]), "remove partition", "p1",
                "partition p1 does not exist")  # another tenant's partition looks like one that does not exist

    assert pod.admin("remove", "user", "bob").code == 0
    failed_line(pod.user("list", "partitions", config=tenants["bob"]), "list partitions", None,
                "invalid user id or access key for user bob")
    after = pod.snapshot()
    assert after == before
    counted = pod.metrics()
    refused = 'vipu_failed_logins_total{reason="invalid credentials"}'  # not whether the user exists: anyone reads metrics
    assert counted[refused] - counted_before.get(refused, 0) == 3
    assert not [sample for sample in counted if "no such user" in sample or "wrong access key" in sample]


def test_the_lockouts_follow_the_servers_options(tmp_path):
    """--login-failures for one user at one address, --login-failures-per-address for any users
    (sparing those proven from it), both for --login-lockout seconds, each refusal one line."""
    pod = Pod(tmp_path, machines=1, secure=True,
              server_options=("--login-failures", "2", "--login-failures-per-address", "4", "--login-lockout", "30")).start()
    try:
        for user in ("alice", "bob"):
            assert pod.admin("create", "user", user).code == 0
        alice, bob = tmp_path / "alice.vipu-cli.hcl", tmp_path / "bob.vipu-cli.hcl"
        for _ in range(2):
            failed_line(pod.user("--api-access-key", "guess", "list", "partitions", config=alice), "list partitions", None,
                        "invalid user id or access key for user alice")
        failed_line(pod.user("list", "partitions", config=alice), "list partitions", None,
                    "too many failed logins for user alice from this address; try again in ")
        assert pod.user("list", "partitions", config=bob).code == 0  # another user at the same address
        for guessed in ("u1", "u2"):  # the address's third and fourth failures
            failed_line(pod.user("--api-user-id", guessed, "list", "partitions", config=bob), "list partitions", None,
                        f"invalid user id or access key for user {guessed}")
        failed_line(pod.user("--api-user-id", "carol", "list", "partitions", config=bob), "list partitions", None,
                    "too many failed logins from this address; try again in ")
        assert pod.user("list", "partitions", config=bob).code == 0  # bob logged in from here before
        assert pod.admin("list", "users").code == 0
    finally:
        pod.stop()


def test_users_are_given_and_denied_allocations_and_the_last_administrator_stays(pod, tenants):
    assert pod.admin("update", "user", "carol", "--give", "a1", "--deny", "a2").code == 0
    assert pairs(pod.admin("get", "user", "carol").out)["Allocations"] == "a1"
    assert [r[0] for r in rows(pod.user("list", "allocations", config=tenants["carol"]).out)] == ["a1"]
    failed_line(pod.admin("update", "user", "carol", "--deny", "a2"), "update user", "carol", "allocation a2 is not given to user carol")
    failed_line(pod.admin("update", "user", "carol", "--give", "a9"), "update user", "carol", "allocation a9 does not exist")
    failed_line(pod.admin("create", "user", "alice"), "create user", "alice", "user alice already exists")
    failed_line(pod.admin("remove", "user", "admin"), "remove user", "admin", "user admin is the last administrator")


def test_keys_are_kept_only_as_salted_hashes_and_never_logged(pod, tenants):
    keys = [key_of(config) for config in tenants.values()] + [pod.admin_key]
    store = pod.db_url.removeprefix("sqlite:///")
    content = b"".join(Path(path).read_bytes() for path in (store, store + "-wal") if os.path.exists(path))
    log = (pod.directory / "server.log").read_text()
    for key in keys:
        assert key.encode() not in content and key not in log


def test_the_admin_end_point_can_listen_on_an_address_of_its_own(tmp_path):
    pod = Pod(tmp_path, machines=1, secure=True)
    pod.initialise()  # the server is started by hand below: the harness waits on 127.0.0.1
    with open(tmp_path / "server.log", "ab") as log:
        server = subprocess.Popen(
            [str(BIN / "vipu-server"), "--secure", "--tls-dir", str(pod.tls.root), "--db", pod.db_url,
             "--listen-address", "127.0.0.1", "--port", str(pod.user_port), "--admin-listen-address", "127.0.0.2",
             "--admin-port", str(pod.admin_port), "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def admin(host: str) -> Result:
            done = subprocess.run([str(BIN / "vipu-admin"), "--config", str(pod.admin_config), "-H", host, "list", "agents"],
                                  capture_output=True, text=True, timeout=60)
            return Result(done.returncode, done.stdout, done.stderr)

        wait_until(lambda: admin("127.0.0.2").code == 0, what="the admin end-point on 127.0.0.2")
        failed_line(admin("127.0.0.1"), "list agents", None, "unreachable (connection refused)")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_open_mode_says_so_and_has_no_users(tmp_path):
    port, admin_port = free_port(), free_port()
    log = tmp_path / "server.log"
    with open(log, "ab") as out:
        server = subprocess.Popen([str(BIN / "vipu-server"), "--db", f"sqlite:///{tmp_path / 'v.db'}", "--listen-address",
                                   "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port), "--metrics-port", "0"],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "ready" in log.read_text(), what="vipu-server")
        assert "open mode: no TLS and no authentication" in log.read_text()
        done = subprocess.run([str(BIN / "vipu-admin"), "-H", "127.0.0.1", "--api-port", str(admin_port), "create", "user", "x"],
                              capture_output=True, text=True, timeout=60)
        failed_line(Result(done.returncode, done.stdout, done.stderr), "create user", "x", "runs in open mode, without users")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_slurm_prolog_and_epilog_reach_a_secure_controller_as_their_api_user(pod, tenants, tmp_path):
    files = pod.tls
    conf = tmp_path / "vipu.conf"
    ipuof = tmp_path / "ipuof"

    def write_conf(key: str) -> None:
        conf.write_text(f"ApiHost=127.0.0.1\nApiPort={pod.user_port}\nIpuofDir={ipuof}\nIsSecure=yes\nApiUser=alice\n"
                        f"ApiAccessKey={key}\nClientCertFile={files.client_cert}\nClientKeyFile={files.client_key}\n"
                        f"ServerCertFile={files.ca_for(files.client_dir)}\n")

    def run(step: str, job: str) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ["PATH"], "VIPU_SLURM_CONF": str(conf), "SLURM_JOB_ID": job, "SPANK_VIPU_IPUS": "2"}
        return subprocess.run([str(BIN / f"vipu-slurm-{step}")], capture_output=True, text=True, env=env, timeout=60)

    write_conf(key_of(tenants["alice"]))
    assert run("prolog", "41").returncode == 0
    (listed,) = [p for p in pod.snapshot()["partitions"] if p.id == "slurm-41"]
    assert listed.spec.allocation_id == "a1" and [p.name for p in ipuof.iterdir()] == ["slurm-41_ipuof.conf"]
    assert run("epilog", "41").returncode == 0
    assert not [p for p in pod.snapshot()["partitions"] if p.id == "slurm-41"] and list(ipuof.iterdir()) == []

    write_conf("not-alices-key")
    refused = run("prolog", "42")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("vipu-slurm prolog (job 42): failed: ")
    assert not [p for p in pod.snapshot()["partitions"] if p.id == "slurm-42"]


def test_in_secure_mode_an_agent_answers_its_controller_alone(pod, tenants, tmp_path):
    """The agent link has its own authority: a plaintext client, a user's client certificate and
    another site's controller are each refused at the handshake, and the machine is left as it was."""
    assert pod.user("create", "partition", "held", "--size", "4", config=tenants["alice"]).code == 0
    machine = next(m for m in pod.rack.machines if "held" in pod.held(m.name))
    before = {m.name: pod.held(m.name) for m in pod.rack.machines}
    address = f"127.0.0.1:{machine.port}"
    clear = agent_pb2.ClearPartitionRequest(partition_id="held")
    other_site = TlsFiles(tmp_path / "other-site")
    generate(other_site, ["localhost", "127.0.0.1"])
    agents_authority = pod.tls.ca_for(pod.tls.controller_dir).read_bytes()  # each client trusts the agent: it is the agent that refuses
    users_own = grpc.ssl_channel_credentials(agents_authority, pod.tls.client_key.read_bytes(), pod.tls.client_cert.read_bytes())
    other_sites = grpc.ssl_channel_credentials(agents_authority, other_site.controller_key.read_bytes(),
                                               other_site.controller_cert.read_bytes())
    for name, channel in (("plaintext", grpc.insecure_channel(address)),
                          ("a user's certificate", grpc.secure_channel(address, users_own)),
                          ("another site's controller", grpc.secure_channel(address, other_sites))):
        with channel, pytest.raises(grpc.RpcError) as refused:
            agent_pb2_grpc.AgentServiceStub(channel).ClearPartition(clear, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name
        assert "\n" not in refused.value.details(), name
    with grpc.secure_channel(address, agent_channel_credentials(pod.tls)) as channel:  # the site's own credentials get through
        assert agent_pb2_grpc.AgentServiceStub(channel).ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=5).partitions
    assert {m.name: pod.held(m.name) for m in pod.rack.machines} == before
    assert pod.user("remove", "partition", "held", config=tenants["alice"]).code == 0  # the controller itself gets through


def test_a_machine_obeys_the_controller_holding_it_until_the_site_hands_it_over(pod, tenants, tmp_path):
    """A second controller of the site (its certificate from the same authority, another name) is
    refused by a held machine, through its controller and directly, in one line naming the holder,
    with nothing changed; it cannot take the machine over without the site's authority key; with
    it, it can, and the machine's partitions are cleared; the hold survives an agent restart, and
    removing the agent hands the machine back."""
    assert pod.user("create", "partition", "kept", "--size", "4", config=tenants["alice"]).code == 0
    machine = next(m for m in pod.rack.machines if "kept" in pod.held(m.name))
    agent_id = next(a.id for a in pod.admin_api.ListAgents(admin_pb2.ListRequest()).agents if a.port == machine.port)
    group = next(g for g in pod.agent_groups if machine.name in g)
    before = {m.name: pod.held(m.name) for m in pod.rack.machines}
    second = Pod(tmp_path / "second", machines=1, secure=True)
    issue = [str(BIN / "vipu-certs"), "controller", "ctl-b", "--tls-dir", str(pod.tls.root), "--out", str(second.tls.controller_dir)]
    issued = subprocess.run(issue, capture_output=True, text=True, timeout=30)
    assert issued.returncode == 0, issued.stderr
    again = subprocess.run([*issue[:-1], str(tmp_path / "elsewhere")], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "a controller named ctl-b has a certificate of this site already" in again.stderr
    assert "Using the agent link certificate the site issued" in second.initialise()  # its own users' authority, the site's link
    second.start_server()
    register = ("create", "agent", "taken", "--host", "127.0.0.1", "--port", str(machine.port))
    try:
        failed_line(second.admin(*register), "create agent", "taken",
                    f"machine {machine.name} is held by controller vipu-controller, not ctl-b")
        failed_line(second.admin(*register, "--take-over"), "create agent", "taken",
                    "this controller does not hold the site's agent-link authority key")
        direct = second.agent_stub_at(machine.port)
        with pytest.raises(grpc.RpcError) as refused:
            direct.ClearPartition(agent_pb2.ClearPartitionRequest(partition_id="kept"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "held by controller vipu-controller" in refused.value.details() and "\n" not in refused.value.details()
        assert {m.name: pod.held(m.name) for m in pod.rack.machines} == before

        shutil.copy(pod.tls.link_ca_key, second.tls.link_ca_key)  # the site's administrator lends the authority's key
        assert second.admin(*register, "--take-over").code == 0
        assert direct.ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=5).partitions == []  # cleared
        pod.wait_for_status(agent_id, "Down")
        assert "held by controller ctl-b" in pod.admin_api.GetAgent(admin_pb2.GetRequest(id=agent_id)).last_error
        wait_until(lambda: "ERROR" in pod.user("get", "partition", "kept", config=tenants["alice"]).out, what="kept in ERROR")
        pod.stop_agent(group[0])  # kill -9: the agent comes back still held by ctl-b
        pod.start_agent(*group)
        pod.wait_for_agent(machine.name)
        assert pod.agent_stub_at(machine.port).GetInventory(agent_pb2.GetInventoryRequest(), timeout=5).holder == "ctl-b"
        removed = second.admin("remove", "agent", "taken")
        assert removed.code == 0, removed.err
    except BaseException:
        second.admin("remove", "agent", "taken")  # hand the machine back to the module's pod whatever failed
        raise
    finally:
        second.stop()
    pod.wait_for_status(agent_id, "Up")  # released: its first controller holds it again
    wait_until(lambda: pod.held(machine.name) == before[machine.name], what="kept re-applied by its automatic reset")
    assert pod.agent_stub_at(machine.port).GetInventory(agent_pb2.GetInventoryRequest(), timeout=5).holder == "vipu-controller"
