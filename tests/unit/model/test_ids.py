"""One grammar for every id, matched whole, with a maximum length; refusals quote a shortened id."""

from __future__ import annotations

import pytest

from vipu.model.entities import ID_MAX_LENGTH, check_id, check_partition_id
from vipu.model.errors import InvalidArgument


@pytest.mark.parametrize("value", ["p1", "a", "A.b_c:d-e", "9" * ID_MAX_LENGTH, "q_gcd", "q_gcd0x"])
def test_ids_of_the_grammar_are_taken(value):
    assert check_partition_id(value) == value


@pytest.mark.parametrize("value", ["", "p1\n", "\np1", "p 1", "-p", "a/b", "é", "x" * (ID_MAX_LENGTH + 1)])
def test_anything_else_is_refused_whole(value):
    with pytest.raises(InvalidArgument, match="use 1 to 63 letters"):
        check_id("agent", value)


def test_a_refusal_quotes_a_long_id_shortened():
    with pytest.raises(InvalidArgument) as refused:
        check_id("cluster", "x" * 100_000)
    assert len(refused.value.message) < 200 and "(100000 characters)" in refused.value.message


@pytest.mark.parametrize("value, owner", [("q_gcd0", "q"), ("train_gcd12", "train")])
def test_a_partition_id_that_names_another_partitions_gcd_file_is_refused(value, owner):
    with pytest.raises(InvalidArgument, match=f"the IPUoF file of a GCD of partition '{owner}'"):
        check_partition_id(value)
