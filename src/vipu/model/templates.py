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

MOST_PARTITIONS = 64  # of one template: an allocation of 64 machines split into single machines
_PART = re.compile(r"(\d+)x(\d+)")


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
                raise InvalidArgument(f"template {name!r}: write its partitions as COUNTxSIZE, joined by + (4x16, 2x16+8x4), "
                                      f"not {part!r}")
            count, size = int(found[1]), int(found[2])
            if count < 1:
                raise InvalidArgument(f"template {name!r}: {part!r} makes no partition")
            if size < 1 or size & (size - 1):
                raise InvalidArgument(f"template {name!r}: a partition's size must be a power of two, not {size}")
            sizes += [size] * count
        if len(sizes) > MOST_PARTITIONS:
            raise InvalidArgument(f"template {name!r} makes {len(sizes)} partitions; at most {MOST_PARTITIONS}")
        return cls(name.replace(" ", ""), tuple(sizes))

    def partition_ids(self, prefix: str = "") -> list[str]:
        """Its partitions' ids: PREFIX1, PREFIX2, ...; InvalidArgument for a prefix that makes no valid id."""
        prefix = prefix or f"{self.name.replace('+', '-')}-"
        return [check_id("partition", f"{prefix}{n}") for n in range(1, len(self.sizes) + 1)]

    @property
    def ipus(self) -> int:
        return sum(self.sizes)
