"""Text files a user names (a client configuration, an IPUoF configuration, a rack description),
read with a bound: a regular file of UTF-8 text no longer than its kind can be. A device such as
/dev/zero would otherwise be read until memory runs out, and a FIFO would be waited on for ever;
each is refused in one line instead."""

from __future__ import annotations

from pathlib import Path

from vipu.model.errors import InvalidArgument


def read_text(path: Path, limit_bytes: int, kind: str, what: str = "") -> str:
    """The file's text; InvalidArgument saying why not (`what` names the file in the message, as
    "rack description "; `kind` says what a file this long is not, as "a client configuration")."""
    named = f"{what}{path}"
    try:
        if not path.is_file():
            raise InvalidArgument(f"cannot read {named}: not a regular file" if path.exists() else f"cannot read {named}: no such file")
        with path.open("rb") as stream:
            data = stream.read(limit_bytes + 1)
    except OSError as error:
        raise InvalidArgument(f"cannot read {named}: {error.strerror}") from error
    if len(data) > limit_bytes:
        raise InvalidArgument(f"cannot read {named}: longer than {limit_bytes // 1024} KiB, not {kind}")
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise InvalidArgument(f"cannot read {named}: not UTF-8 text (byte {error.start})") from error
