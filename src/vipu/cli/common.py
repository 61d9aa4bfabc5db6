"""What `vipu-admin` and `vipu` share: connecting, one-line results, tables and JSON.

Every command ends in exactly one of three ways: its output (a table, JSON, or the line
`<action> (<id>): success.`), the one-line failure `<action> (<id>): failed: <reason>.` on
standard error with exit status 1, or a one-line usage error with exit status 2. No traceback
reaches the user.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import sys
import textwrap
import time
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click

from vipu.client.settings import Given
from vipu.model.errors import VipuError, one_line
from vipu.model.times import utc_text

if typing.TYPE_CHECKING:
    from google.protobuf.message import Message

    from vipu.client.base import EndpointClient

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


class ClientHolder:
    """The client of a command line, made when a command first needs it: the root command runs
    before its subcommand's arguments are read, and a usage mistake should cost no connection (nor
    the import of gRPC, which vipu.client makes; nothing here imports it or the API's stubs)."""

    def __init__(self, make: typing.Callable[[], EndpointClient]):
        self._make = make
        self._client: EndpointClient | None = None

    def get(self) -> EndpointClient:
        if self._client is None:
            self._client = self._make()
        return self._client


def pass_client(command):
    """Hand the command the client of its command line as its first argument."""
    @click.pass_context
    def with_client(ctx: click.Context, *args, **kwargs):
        holder = ctx.find_object(ClientHolder)
        assert holder is not None, "a command that takes the client runs under a root that made one"
        return ctx.invoke(command, holder.get(), *args, **kwargs)

    return functools.update_wrapper(with_client, command)


def lazy_module(name: str) -> types.ModuleType:
    """The module `name`, imported when one of its attributes is first used: the commands' help and
    usage mistakes are answered without gRPC and the API's stubs, which take most of a command's
    start-up."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name}")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def open_client(ctx: click.Context, make_client: typing.Callable[[], EndpointClient], server_version: bool) -> None:
    """What a CLI's root does: keep how to make the client for the command, and answer
    --server-version or a bare command."""
    ctx.obj = ClientHolder(make_client)
    if server_version:
        print_server_version(ctx.obj.get())
        ctx.exit(0)
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


ipuof_dir_option = click.option(
    "--ipuof-dir", type=click.Path(file_okay=False, path_type=Path), envvar="VIPU_IPUOF_DIR", default=None,
    help="Where IPUoF configuration files are. Default: ~/.ipuof.conf.d (/etc/ipuof.conf.d for root).",
)


def connection_options(default_port: int):
    """The options both CLIs take to reach vipu-server and to say who is calling."""
    options = [
        click.option("-H", "--api-host", default=None,
                     help="Host of vipu-server, or the replicas of a highly available one as H1,H2,... (each may be HOST:PORT); "
                          "they are tried in turn. Default: $VIPU_CLI_API_HOST, the config file, or localhost."),
        click.option("--api-port", type=click.IntRange(1, 65535), default=None,
                     help=f"Port of the end-point. Default: the config file, or {default_port}."),
        click.option("--api-timeout", default=60.0, show_default=True, help="Seconds to wait for an answer."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Client configuration file (HCL). Default: /etc/vipu/vipu-cli.hcl if it exists."),
        click.option("--api-user-id", default=None,
                     help="User to act as in secure mode. Default: $VIPU_CLI_API_USER_ID or the config file."),
        click.option("--api-access-key", default=None,
                     help="That user's access key. Default: $VIPU_CLI_API_ACCESS_KEY or the config file."),
        click.option("--tls-server-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Certificate authority of the server's certificate (mutual TLS)."),
        click.option("--tls-client-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Client certificate (mutual TLS)."),
        click.option("--tls-client-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Client certificate's key (mutual TLS)."),
        click.option("--server-version", is_flag=True, help="Print the version of vipu-server and exit."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def given(params: dict) -> Given:
    """The connection options of a command line, as `client_settings` takes them."""
    return Given(config=params["config_path"], host=params["api_host"], port=params["api_port"],
                 user_id=params["api_user_id"], access_key=params["api_access_key"],
                 server_cert=params["tls_server_cert"], client_cert=params["tls_client_cert"], client_key=params["tls_client_key"])


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else f"{text}."


def fail(action: str, subject: str | None, message: str) -> None:
    head = f"{action} ({one_line(subject)})" if subject else action
    click.echo(f"{head}: failed: {_sentence(one_line(message))}", err=True)
    sys.exit(1)


@contextmanager
def reporting(action: str, subject: str | None = None) -> Iterator[None]:
    """Turn a VipuError inside the block into the one-line failure and exit status 1."""
    try:
        yield
    except VipuError as error:
        fail(action, subject, error.message)


@contextmanager
def refusing_to_start(program: str) -> Iterator[None]:
    """Turn a VipuError inside the block into a program's refusal to start: `PROGRAM: REASON` and
    exit status 2, as a usage mistake (an option, a file, a port) is told."""
    try:
        yield
    except VipuError as error:
        click.echo(f"{program}: {one_line(error.message)}", err=True)
        sys.exit(2)


def succeed(action: str, subject: str) -> None:
    click.echo(f"{action} ({subject}): success.")


Cell = str | Sequence[str]


LAST_COLUMN_MIN_WIDTH = 24  # a wrapped last column keeps at least this much, the table overflowing rather than less


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], top_rule: bool = True, fit: int | None = None) -> str:
    """An ASCII table in the seeds' style; a cell holding several lines spreads over rows. Given
    `fit` (a terminal's columns), the last column's text is wrapped to keep the table that wide."""
    lines_of = [[[str(c)] if isinstance(c, (str, int)) else [str(x) for x in c] or [""] for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in lines_of:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max([widths[i], *(len(line) for line in cell)])
    if fit is not None and lines_of:
        room = max(LAST_COLUMN_MIN_WIDTH, len(headers[-1]), fit - (sum(widths[:-1]) + 3 * len(widths) - 1))
        for row in lines_of:
            row[-1] = [wrapped for line in row[-1] for wrapped in textwrap.wrap(line, room, break_on_hyphens=False) or [""]]
    for row in lines_of:
        widths[-1] = max([widths[-1], *(len(line) for line in row[-1])])

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
    import json

    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import Message

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


BARE_GROUP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2 and later


def run(group: click.Group, prog: str) -> typing.NoReturn:
    """Run a CLI so that every usage mistake is one line on standard error and exit status 2; then
    end the process at once, its output flushed: the interpreter's teardown (gRPC's threads, every
    module) would take longer than most commands."""
    code = exit_status(group, prog)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away: what is unwritten is lost either way
        code = code or 1
    os._exit(code)


class Terminated(KeyboardInterrupt):
    """A terminating signal, raised where Ctrl-C's interruption would be: what a command undoes when
    interrupted (a waiting request withdrawn) is undone when `timeout`, a closed terminal or a batch
    system ends it too."""

    def __init__(self, number: int):
        super().__init__(signal.Signals(number).name)
        self.signal = number


@contextmanager
def terminating_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Terminated, and SIGINT KeyboardInterrupt, even in
    a process that started with SIGINT ignored (Python then leaves it ignored: the child of a
    script's background job, or of a pytest-xdist worker), so that an interrupt sent on purpose
    is always undone as Ctrl-C's is."""
    def interrupt(number: int, _frame) -> None:
        raise Terminated(number)

    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def exit_status(group: click.Group, prog: str) -> int:
    """What `run` does short of ending the process: run the CLI; its exit status."""
    for number, argument in enumerate(sys.argv[1:], start=1):
        if any("\ud800" <= character <= "\udfff" for character in argument):  # bytes Python kept as they came: not UTF-8
            shown = argument.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            click.echo(f"{prog}: argument {number} ({shown}) is not UTF-8 text (see '{prog} --help')", err=True)
            return 2
    try:
        with terminating_signals_interrupt():
            group.main(prog_name=prog, standalone_mode=False)
    except BARE_GROUP as bare:  # `vipu create` alone asks what it can create: its help, as `vipu` alone gives
        click.echo(bare.ctx.get_help())
    except click.UsageError as error:
        where = error.ctx.command_path if error.ctx else prog
        click.echo(f"{where}: {one_line(error.format_message())} (see '{where} --help')", err=True)
        return 2
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.Abort as aborted:
        return 128 + aborted.__cause__.signal if isinstance(aborted.__cause__, Terminated) else 130
    except click.ClickException as error:
        click.echo(f"{prog}: {one_line(error.format_message())}", err=True)
        return error.exit_code
    except SystemExit as done:  # a command that ended itself (a failure is exit status 1)
        if isinstance(done.code, str):
            click.echo(done.code, err=True)
            return 1
        return done.code or 0
    return 0


def print_server_version(client: EndpointClient) -> None:
    with reporting("server version"):
        version = client.version()
    click.echo(f"version: {version}")
    click.echo(f"host: {client.connection.address}")


def capacity_command(group: click.Group) -> None:
    """`list capacity`, the same in both CLIs: free and used IPUs per allocation, as `sinfo` shows free nodes."""

    @group.command("capacity")
    @click.option("--size", type=click.IntRange(0, 2**32 - 1), default=0, help="Also count the partitions of this size that fit now.")
    @click.option("--allocation", "allocation_id", default="", help="Only this allocation.")
    @click.option("--cluster", "cluster_id", default="", help="Only the allocations of this cluster.")
    @json_option
    @pass_client
    def list_capacity(client, size, allocation_id, cluster_id, as_json):
        """Show the IPUs used and free in each allocation, the largest partition that fits now and,
        with --size, how many of that size fit side by side."""
        with reporting("list capacity"):
            reply = client.capacity(size, allocation_id=allocation_id, cluster_id=cluster_id)
        if as_json:
            return echo_json(reply)
        headers = ["Allocation", "Cluster", "IPUs", "Used", "Free", "Largest Fit", *([f"Fit of {size}"] if size else []), "Note"]
        rows = [[a.allocation_id, a.cluster_id, str(a.total_ipus), str(a.used_ipus), str(a.free_ipus), str(a.largest),
                 *([str(a.fitting)] if size else []), a.blocked or "-"] for a in reply.allocations]
        click.echo(render_table(headers, rows))


def requests_command(group: click.Group) -> None:
    """`list requests`, the same in both CLIs: the requests waiting for room, each allocation's queue in order."""

    @group.command("requests")
    @click.option("--allocation", "allocation_id", default="", help="Only this allocation's queue.")
    @click.option("--wide", is_flag=True, help="On a terminal, each reason on one line however wide, not wrapped to fit.")
    @json_option
    @pass_client
    def list_requests(client, allocation_id, wide, as_json):
        """Show the partition requests waiting for room: their place in their allocation's queue,
        size, user, since when they wait and why."""
        with reporting("list requests"):
            queued = client.list_queued(allocation_id)
        if as_json:
            return echo_json({"requests": queued})
        rows = [[str(q.position), q.partition_id, q.allocation_id, str(q.size), q.user or "-",
                 utc_text(q.since.ToDatetime()), q.reason] for q in queued]
        click.echo(render_table(["Position", "Partition", "Allocation", "Size", "User", "Waiting Since", "Why"], rows,
                                fit=None if wide else terminal_width()))


def reservations_command(group: click.Group) -> None:
    """`list reservations`, the same in both CLIs: the maintenance windows and reservations of the
    allocations the caller may use, by start."""

    @group.command("reservations")
    @click.option("--allocation", "allocation_id", default="", help="Only this allocation's.")
    @json_option
    @pass_client
    def list_reservations(client, allocation_id, as_json):
        """Show the maintenance windows and the reservations for people: their IPUs, how many are
        in use, when, for whom and why."""
        from vipu.api.convert import reservation_from_proto

        with reporting("list reservations"):
            found = client.list_reservations(allocation_id)
        if as_json:
            return echo_json({"reservations": found})
        now, rows = time.time(), []
        for message in found:
            r = reservation_from_proto(message)
            rows.append([r.name, r.kind, r.allocation_id, f"{r.size} ({' '.join(r.agent_ids)})", str(message.ipus_in_use),
                         utc_text(r.start, labelled=False), utc_text(r.end, labelled=False), r.phase(now),
                         " ".join([*r.users, *(f"account:{a}" for a in r.accounts)]) or "-",
                         f"{r.reason} (by {r.operator})"])
        click.echo(render_table(["Name", "Kind", "Allocation", "IPUs", "In Use", "Start (UTC)", "End (UTC)", "State", "Users",
                                 "Reason"], rows, fit=terminal_width()))


def terminal_width() -> int | None:
    """The columns of the terminal standard output is; None when it is not one (a pipe, a file)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def cancel_request_command(group: click.Group, whose: str) -> None:
    """`remove request P`, the same in both CLIs but for `whose` requests it may cancel."""

    @group.command("request", help=f"Cancel a request waiting for room ({whose}).")
    @click.argument("partition_id")
    @pass_client
    def remove_request(client, partition_id):
        with reporting("remove request", partition_id):
            client.cancel_queued(partition_id)
        succeed("remove request", partition_id)
