"""Users and access keys: stored as salted hashes, checked quickly, revoked at once."""

from __future__ import annotations

import pytest

from vipu.api import credentials
from vipu.controller.auth import Authenticator, caller
from vipu.controller.usecases import users as users_module
from vipu.controller.usecases.users import UserService
from vipu.model.entities import Allocation, Cluster, Role
from vipu.model.errors import Conflict, NotFound, PermissionDenied, Unauthenticated
from vipu.model.throttle import LoginThrottle
from vipu.store.store import Store


@pytest.fixture
def users(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    with store.transaction() as tx:
        tx.add_cluster(Cluster("cl0", ()))
        tx.add_allocation(Allocation("a1", "cl0", ()))
    yield UserService(store)
    store.close()


def test_a_key_is_stored_salted_and_hashed_and_unlocks_only_its_user(users):
    _, key = users.create("alice", ("a1",))
    _, other = users.create("bob", ("a1",))
    with users.store.reading() as tx:
        alice, bob = tx.get_credential("alice"), tx.get_credential("bob")
    assert key.encode() not in alice.digest and alice.salt != bob.salt and len(alice.digest) == 32
    access = users.authenticate("alice", key)
    assert (access.user_id, access.allocations) == ("alice", frozenset({"a1"}))
    with pytest.raises(Unauthenticated, match="invalid user id or access key for user alice"):
        users.authenticate("alice", other)
    with pytest.raises(Unauthenticated, match="give a user id and access key"):
        users.authenticate("", "")


def test_a_checked_key_is_remembered_until_it_is_rotated(users, monkeypatch):
    _, key = users.create("alice")
    users.authenticate("alice", key)
    calls = []
    monkeypatch.setattr(users_module, "digest", lambda *a: calls.append(a) or b"")
    users.authenticate("alice", key)
    assert calls == []  # remembered: no scrypt
    monkeypatch.undo()
    _, new_key = users.update("alice", rotate=True)
    with pytest.raises(Unauthenticated):
        users.authenticate("alice", key)
    assert users.authenticate("alice", new_key).user_id == "alice"


def test_administrators_alone_pass_the_admin_end_point(users):
    _, admin_key = users.create("root", admin=True)
    _, user_key = users.create("alice")
    assert users.authenticate("root", admin_key, admin_only=True).unrestricted
    with pytest.raises(PermissionDenied, match="not an administrator"):
        users.authenticate("alice", user_key, admin_only=True)
    with pytest.raises(Conflict, match="last administrator"):
        users.remove("root")
    users.remove("alice")
    with pytest.raises(Unauthenticated):
        users.authenticate("alice", user_key)
    assert users.has_administrator() and users.get("root").role is Role.ADMIN


def test_allocations_given_must_exist(users):
    with pytest.raises(NotFound, match="allocation a9 does not exist"):
        users.create("alice", ("a9",))
    with pytest.raises(NotFound):
        users.get("alice")


def test_every_refusal_costs_one_full_scrypt_so_time_tells_nothing(users, monkeypatch, caplog):
    """An unknown user, a known user's wrong key, and a wrong key after that user's good login each
    cost exactly one scrypt, as a first good login does; only a remembered good key skips it."""
    _, key = users.create("alice")
    users.authenticate("alice", key)  # remembered from now on
    real = users_module.digest
    calls: list[str] = []

    def counted(*args):
        calls.append("scrypt")
        return real(*args)

    monkeypatch.setattr(users_module, "digest", counted)
    for user_id, attempt in (("nobody", key), ("alice", "wrong"), ("alice", key + "x")):
        calls.clear()
        with pytest.raises(Unauthenticated, match=f"invalid user id or access key for user {user_id}"):
            users.authenticate(user_id, attempt)
        assert calls == ["scrypt"], user_id
    calls.clear()
    users.authenticate("alice", key)
    assert calls == []
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == ["authentication of user 'nobody' from ? refused: no such user",
                        "authentication of user 'alice' from ? refused: wrong access key",
                        "authentication of user 'alice' from ? refused: wrong access key"]
    assert not any(key in r.getMessage() for r in caplog.records)


def test_a_user_guessed_at_from_one_address_is_locked_out_there_for_a_while_and_nobody_else_is(tmp_path, caplog):
    now = [1000.0]
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    users = UserService(store, LoginThrottle(limit=3, lockout=60, clock=lambda: now[0]))
    try:
        _, key = users.create("alice")
        _, bobs = users.create("bob")
        attacker, neighbour = "ipv4:10.0.0.9:51000", "ipv4:10.0.0.7:40000"
        for port in (51000, 51001, 51002):  # a new port each time is the same address
            with pytest.raises(Unauthenticated, match="invalid user id or access key"):
                users.authenticate("alice", "guess", peer=f"ipv4:10.0.0.9:{port}")
        with pytest.raises(Unauthenticated, match="too many failed logins for user alice from this address; try again in 60 s"):
            users.authenticate("alice", key, peer=attacker)  # even the right key, until the lockout ends
        assert users.authenticate("bob", bobs, peer=attacker).user_id == "bob"  # another user behind the same address
        assert users.authenticate("alice", key, peer=neighbour).user_id == "alice"  # the same user from elsewhere
        now[0] += 61
        assert users.authenticate("alice", key, peer=attacker).user_id == "alice"
        assert any("logins of user 'alice' from ipv4:10.0.0.9 refused for 60 s after 3 failures" in r.getMessage()
                   for r in caplog.records)
        assert any("from ipv4:10.0.0.9:51001 refused: wrong access key" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_an_address_trying_many_users_is_locked_out_for_all_but_the_users_proven_from_it(tmp_path, caplog):
    now = [1000.0]
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    users = UserService(store, LoginThrottle(limit=3, lockout=60, address_limit=5, clock=lambda: now[0]))
    try:
        _, alices = users.create("alice")
        _, bobs = users.create("bob")
        shared, elsewhere = "ipv4:10.0.0.9:51000", "ipv4:10.0.0.7:40000"
        assert users.authenticate("alice", alices, peer=shared).user_id == "alice"  # alice works through that address
        for guessed in ("u1", "u2", "u3", "u4", "bob"):  # one failure each: no single user is locked out
            with pytest.raises(Unauthenticated, match="invalid user id or access key"):
                users.authenticate(guessed, "guess", peer=shared)
        with pytest.raises(Unauthenticated, match=r"^too many failed logins from this address; try again in 60 s$"):
            users.authenticate("bob", bobs, peer=shared)  # even the right key of a user not proven from there
        assert users.authenticate("alice", alices, peer=shared).user_id == "alice"
        assert users.authenticate("bob", bobs, peer=elsewhere).user_id == "bob"
        now[0] += 61
        assert users.authenticate("bob", bobs, peer=shared).user_id == "bob"
        lockouts = [r.getMessage() for r in caplog.records if "refused for" in r.getMessage()]
        assert lockouts == ["logins from ipv4:10.0.0.9 refused for 60 s, but for users proven from there, after 5 failures"]
    finally:
        store.close()


def test_through_the_dashboard_failures_count_against_the_browsers_address_when_it_proves_it_holds_the_server_key(tmp_path, caplog):
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    users = UserService(store, LoginThrottle(limit=3, lockout=60))
    proof = credentials.forwarding_proof(b"the server's private key")
    authenticate = Authenticator(users, admin_only=False, forwarding_proof=proof)
    dashboard = "ipv4:10.0.0.2:41000"

    def log_in(user_id: str, key: str, metadata: tuple = (), peer: str = dashboard) -> str:
        with authenticate("/virmgrpc.UserService/ListAllocations", dict(credentials.metadata(user_id, key) + metadata), peer):
            return caller().user_id

    try:
        _, key = users.create("alice")
        from_attacker = credentials.forwarded("192.0.2.66", proof)
        for _ in range(3):
            with pytest.raises(Unauthenticated, match="invalid user id or access key"):
                log_in("alice", "guess", from_attacker)
        with pytest.raises(Unauthenticated, match="too many failed logins for user alice from this address"):
            log_in("alice", key, from_attacker)
        assert log_in("alice", key, credentials.forwarded("192.0.2.7", proof)) == "alice"  # another browser, same dashboard
        assert log_in("alice", key) == "alice"  # the dashboard's own calls for alice's open pages
        assert any("authentication of user 'alice' from ipv4:192.0.2.66 through ipv4:10.0.0.2:41000 refused" in r.getMessage()
                   for r in caplog.records)
        with pytest.raises(Unauthenticated, match="too many failed logins"):  # one host, one count, however it calls
            log_in("alice", key, peer="ipv4:192.0.2.66:50000")
        # Without the proof, a caller's say-so changes nothing: its failures are its own address's.
        forged = credentials.forwarded("192.0.2.8", "a guess at the proof")
        for _ in range(3):
            with pytest.raises(Unauthenticated, match="invalid user id or access key"):
                log_in("alice", "guess", forged, peer="ipv4:10.0.0.9:50000")
        with pytest.raises(Unauthenticated, match="too many failed logins"):
            log_in("alice", key, credentials.forwarded("192.0.2.9", "another guess"), peer="ipv4:10.0.0.9:50001")
        assert log_in("alice", key, credentials.forwarded("192.0.2.8", proof)) == "alice"
        unproven = [r.getMessage() for r in caplog.records if "said whose address" in r.getMessage()]
        assert unproven and unproven[0].startswith("a call from ipv4:10.0.0.9:50000 said whose address it was made for")
        assert "a guess at the proof" not in caplog.text and proof not in caplog.text
    finally:
        store.close()


@pytest.mark.parametrize("address, given_proof, counted", [
    ("192.0.2.66", "right", "192.0.2.66"), ("2001:db8::1", "right", "2001:db8::1"),
    ("192.0.2.66", "wrong", ""), ("192.0.2.66", "", ""), ("not an address", "right", ""), ("", "right", ""),
])
def test_a_forwarded_address_is_taken_only_with_the_proof_and_only_if_it_is_an_address(address, given_proof, counted):
    proof = credentials.forwarding_proof(b"key")
    metadata = dict(credentials.forwarded(address, proof if given_proof == "right" else given_proof))
    assert credentials.forwarded_for(metadata, proof) == counted
    assert credentials.forwarded_for(metadata, None) == ""  # a controller with no proof (open mode) takes none


def test_limits_of_zero_lock_nobody_out(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    users = UserService(store, LoginThrottle(limit=0, lockout=60, address_limit=0))
    try:
        _, key = users.create("alice")
        for _ in range(20):
            with pytest.raises(Unauthenticated, match="invalid user id or access key"):
                users.authenticate("alice", "guess", peer="ipv4:10.0.0.9:51000")
        assert users.authenticate("alice", key, peer="ipv4:10.0.0.9:51000").user_id == "alice"
    finally:
        store.close()
