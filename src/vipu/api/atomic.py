"""Files written whole or not at all: certificates, IPUoF configurations, an agent's holder.

The data goes to a temporary file beside the target, created with the final mode (so a secret is
never readable by others, not even for a moment), is flushed to disk, and replaces the target in
one rename, whose directory entry is flushed too: a crash leaves the old file or the new, never
an empty or half-written one.
"""

from __future__ import annotations

import os
from pathlib import Path

from vipu.model.errors import Unavailable


def write_file(path: Path, data: bytes, mode: int = 0o644, owner: int | None = None) -> None:
    """Replace `path` with `data`; `owner` (a uid) gets the file when the caller may give it away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fchmod(file.fileno(), mode)  # an older temporary file keeps its mode through O_CREAT
            if owner is not None:
                os.fchown(file.fileno(), owner, -1)
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_text_for_readers(path: Path, text: str) -> None:
    """Replace a file another program reads (Slurm's topology, say), readable by all, with `text`;
    Unavailable, in one line, when it cannot be written."""
    try:
        write_file(path, text.encode())
    except OSError as error:
        raise Unavailable(f"cannot write {path}: {error.strerror}") from None
