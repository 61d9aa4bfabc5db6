"""Partition templates: an allocation split the same way again and again, in one step.

A template is named by its shape, `COUNTxSIZE` parts joined by `+` ("4x16": four partitions of 16
IPUs; "2x16+8x4": two of 16 and eight of 4), largest first as written. Its partitions are named
PREFIX1, PREFIX2, ... in that order, the prefix being the template's name and a dash unless given
("4x16-1" .. "4x16-4"). The owner places them all at once, or none (`ApplyTemplate`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vipu.model.entities import check_id
from vipu.model.errors import InvalidArgument

MOST_PARTITIONS = 64  # of one template: a 16-machine allocation split into single IPUs
_PART = re.compile(r"(\d{1,4})x(\d{1,4})")  # a longer number makes no template: refused before it is read


@dataclass(frozen=True)
class Template:
    name: str
    sizes: tuple[int, ...]  # each partition's size in IPUs, in the order they are named

    @classmethod
    def parse(cls, name: str) -> Template:
        """The template a name describes; InvalidArgument saying what is wrong with one that is not."""
        sizes: list[int] = []
        for part in name.split("+"):
            found = _PART.fullmatch(part.strip())
            if found is None:
                shown = part if len(part) <= 20 else f"{part[:20]}..."
                raise InvalidArgument(f"template {name[:40]!r}: write its partitions as COUNTxSIZE of at most 4 digits each, joined "
                                      f"by + (4x16, 2x16+8x4), not {shown!r}")
            count, size = int(found[1]), int(found[2])
            if count < 1:
                raise InvalidArgument(f"template {name!r}: {part!r} makes no partition")
            if size < 1 or size & (size - 1):
                raise InvalidArgument(f"template {name!r}: a partition's size must be a power of two, not {size}")
            if len(sizes) + count > MOST_PARTITIONS:
                raise InvalidArgument(f"template {name!r} makes more than {MOST_PARTITIONS} partitions, the most one may")
            sizes += [size] * count
        return cls("".join(name.split()), tuple(sizes))

    def partition_ids(self, prefix: str = "") -> list[str]:
        """Its partitions' ids: PREFIX1, PREFIX2, ...; InvalidArgument for a prefix that makes no valid id."""
        prefix = prefix or f"{self.name.replace('+', '-')}-"
        return [check_id("partition", f"{prefix}{n}") for n in range(1, len(self.sizes) + 1)]
