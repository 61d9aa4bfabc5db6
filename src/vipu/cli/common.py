"""What `vipu-admin` and `vipu` share: connecting, one-line results, tables and JSON.

Every command ends in exactly one of three ways: its output (a table, JSON, or the line
`<action> (<id>): success.`), the one-line failure `<action> (<id>): failed: <reason>.` on
standard error with exit status 1, or a one-line usage error with exit status 2. No traceback
reaches the user.
"""

from __future__ import annotations

import os

# gRPC's C core logs to stderr on its own (a busy port, for one); vipu says what went wrong itself.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click
import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from vipu.api.protos import version_pb2, version_pb2_grpc
from vipu.api.status import error_from_rpc
from vipu.model.errors import VipuError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


class Connection:
    """A lazily opened channel to one end-point of vipu-server."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self._channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def call(self, stub_class, method: str, request, no_deadline: bool = False):
        """Call a method within the connection's deadline, or as long as it takes."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        try:
            return getattr(stub_class(self._channel), method)(request, timeout=None if no_deadline else self.timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error, f"vipu-server at {self.address}") from None

    def server_version(self) -> str:
        return self.call(version_pb2_grpc.VersionServiceStub, "GetVersion", version_pb2.VersionRequest()).version


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else f"{text}."


def fail(action: str, subject: str | None, message: str) -> None:
    head = f"{action} ({subject})" if subject else action
    click.echo(f"{head}: failed: {_sentence(message)}", err=True)
    sys.exit(1)


@contextmanager
def reporting(action: str, subject: str | None = None) -> Iterator[None]:
    """Turn a VipuError inside the block into the one-line failure and exit status 1."""
    try:
        yield
    except VipuError as error:
        fail(action, subject, error.message)


def succeed(action: str, subject: str) -> None:
    click.echo(f"{action} ({subject}): success.")


Cell = str | Sequence[str]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], top_rule: bool = True) -> str:
    """An ASCII table in the seeds' style; a cell holding several lines spreads over rows."""
    lines_of = [[[str(c)] if isinstance(c, (str, int)) else [str(x) for x in c] or [""] for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in lines_of:
        for i, cell in enumerate(row):
            widths[i] = max([widths[i], *(len(line) for line in cell)])

    def line(cells: Sequence[str]) -> str:
        return "|".join(f" {cell.ljust(widths[i])} " for i, cell in enumerate(cells)).rstrip()

    rule = "-" * (sum(widths) + 3 * len(widths) - 1)
    out = [rule] if top_rule else []
    out += [line(headers), rule]
    for row in lines_of:
        for n in range(max(len(cell) for cell in row)):
            out.append(line([cell[n] if n < len(cell) else "" for cell in row]))
    out.append(rule)
    return "\n".join(out)


def render_pairs(pairs: Sequence[tuple[str, Cell]]) -> str:
    """A key/value table: one key per row, between two rules."""
    table = render_table(["", ""], [[k, v] for k, v in pairs], top_rule=False)
    return table.split("\n", 1)[1]  # everything but the empty header line


def echo_json(value: Message | dict | list) -> None:
    def plain(item):
        if isinstance(item, Message):
            return MessageToDict(item, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        if isinstance(item, list):
            return [plain(v) for v in item]
        return item

    click.echo(json.dumps(plain(value), indent=2, sort_keys=False))


def split_list(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


class CommandGroup(click.Group):
    """A group that also answers to the singular or plural of its commands' names."""

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None:
            for alias in (f"{name}s", name[:-1] if name.endswith("s") else None):
                if alias and (command := super().get_command(ctx, alias)) is not None:
                    break
        return command


def run(group: click.Group, prog: str) -> None:
    """Run a CLI so that every usage mistake is one line on standard error and exit status 2."""
    try:
        group.main(prog_name=prog, standalone_mode=False)
    except click.UsageError as error:
        where = error.ctx.command_path if error.ctx else prog
        click.echo(f"{where}: {error.format_message()} (see '{where} --help')", err=True)
        sys.exit(2)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.Abort:
        sys.exit(130)
    except click.ClickException as error:
        click.echo(f"{prog}: {error.format_message()}", err=True)
        sys.exit(error.exit_code)


def print_server_version(connection: Connection) -> None:
    with reporting("server version"):
        version = connection.server_version()
    click.echo(f"version: {version}")
    click.echo(f"host: {connection.address}")
