"""IPUoF file names: a partition's files are exactly the names it was given, never another's."""

from __future__ import annotations

import pytest

from vipu.ipuof import files
from vipu.ipuof.client import files_of
from vipu.model.entities import check_partition_id
from vipu.model.errors import InvalidArgument, NotFound

# Partitions whose ids the grammar accepts, though they begin like q's GCD files.
NEIGHBOURS = ["q_gcd0x_ipuof.conf", "q_gcd1_2_ipuof.conf", "q_gcd_ipuof.conf", "qq_gcd0_ipuof.conf"]
Q_FILES = ["q_gcd0_ipuof.conf", "q_gcd1_ipuof.conf", "q_gcd10_ipuof.conf", "q_gcd2_ipuof.conf"]


def test_a_partitions_gcd_files_are_found_in_gcd_order_and_no_neighbours_file_among_them(tmp_path):
    for name in [*NEIGHBOURS, *Q_FILES]:
        (tmp_path / name).write_text("{}")
    for partition_id in ("q_gcd0x", "q_gcd1_2", "q_gcd", "qq"):
        check_partition_id(partition_id)
    assert [p.name for p in files_of("q", tmp_path)] == ["q_gcd0_ipuof.conf", "q_gcd1_ipuof.conf", "q_gcd2_ipuof.conf",
                                                        "q_gcd10_ipuof.conf"]
    assert [p.name for p in files.remove(tmp_path, "q")] == sorted(Q_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NEIGHBOURS)
    with pytest.raises(NotFound, match="no IPUoF configuration of partition q in"):
        files_of("q", tmp_path)
    assert [p.name for p in files_of("q_gcd0x", tmp_path)] == ["q_gcd0x_ipuof.conf"]


def test_an_id_that_would_name_another_partitions_gcd_file_is_refused():
    with pytest.raises(InvalidArgument, match="may not end in _gcd and a number"):
        check_partition_id("q_gcd0")


def config_with_key(key: str, gcds: int = 1):
    from vipu.api.protos import vipuuser_pb2 as pb

    return pb.PartitionConfig(gcd_configs=[pb.PartitionConfig.Gcd(attributes={"Attach Key": key, "GCD Id": str(n)})
                                           for n in range(gcds)])


def test_in_the_shared_system_directory_another_controllers_partition_of_the_same_id_keeps_its_files(tmp_path, monkeypatch):
    """As root every controller of a host writes into /etc/ipuof.conf.d: a tenant's p1 must not
    replace another controller's p1, and removing one's p1 must not delete the other's."""
    monkeypatch.setattr(files, "SYSTEM_DIR", tmp_path)
    files.write(tmp_path, "p1", config_with_key("first-controllers"))
    with pytest.raises(FileExistsError, match=r"p1_ipuof\.conf there holds another partition p1, another controller's"):
        files.write(tmp_path, "p1", config_with_key("second-controllers"))
    assert files.attach_key_of(tmp_path / "p1_ipuof.conf") == "first-controllers"
    files.write(tmp_path, "p1", config_with_key("first-controllers"))  # its own files are rewritten (a moved partition)
    assert files.remove(tmp_path, "p1", "second-controllers") == []
    assert files.remove(tmp_path, "p1", "first-controllers") == [tmp_path / "p1_ipuof.conf"]
    other = tmp_path.parent / "elsewhere"
    files.write(other, "p1", config_with_key("first-controllers"))
    files.write(other, "p1", config_with_key("second-controllers"))  # a directory of one user's: a stale file is replaced
    assert files.attach_key_of(other / "p1_ipuof.conf") == "second-controllers"
