"""Users of secure mode and their access keys (kept only as salted hashes), in the store."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from vipu.model.entities import Role, User
from vipu.model.errors import AlreadyExists
from vipu.store.schema import UserAllocationRow, UserRow
from vipu.store.transactions import USERS_CHANGED, TransactionBase


@dataclass(frozen=True)
class Credential:
    """A user's access key as stored: a salted hash, and a version that changes on every rotation."""

    salt: bytes
    digest: bytes
    version: int


def _user(row: UserRow) -> User:
    return User(row.id, Role(row.role), tuple(g.allocation_id for g in row.grants))


class UserRepository(TransactionBase):
    """Users, their grants of allocations and their credentials, through the ORM."""

    def get_user(self, user_id: str) -> User | None:
        row = self.session.get(UserRow, user_id)
        return _user(row) if row else None

    def list_users(self) -> list[User]:
        return [_user(r) for r in self.session.scalars(select(UserRow).order_by(UserRow.id))]

    def get_credential(self, user_id: str) -> Credential | None:
        row = self.session.get(UserRow, user_id)
        return Credential(row.key_salt, row.key_hash, row.key_version) if row else None

    def add_user(self, user: User, credential: Credential) -> None:
        self._changed.add(USERS_CHANGED)
        if self.session.get(UserRow, user.id) is not None:
            raise AlreadyExists(f"user {user.id} already exists")
        self.session.add(UserRow(
            id=user.id, role=user.role.value, key_salt=credential.salt, key_hash=credential.digest,
            key_version=credential.version, grants=[UserAllocationRow(allocation_id=a) for a in user.allocation_ids],
        ))
        self.flush(f"user {user.id} already exists")

    def set_user_allocations(self, user_id: str, allocation_ids: tuple[str, ...]) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get_one(UserRow, user_id)
        row.grants = [UserAllocationRow(allocation_id=a) for a in sorted(set(allocation_ids))]
        self.session.flush()

    def set_credential(self, user_id: str, credential: Credential) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get_one(UserRow, user_id)
        row.key_salt, row.key_hash, row.key_version = credential.salt, credential.digest, credential.version

    def delete_user(self, user_id: str) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get(UserRow, user_id)
        if row is not None:
            self.session.delete(row)
            self.session.flush()
