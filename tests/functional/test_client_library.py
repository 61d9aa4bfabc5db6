"""vipu.client as the README shows it, against a real controller and real agents."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vipu.client import AdminClient, AlreadyExists, UserClient

ROOT = Path(__file__).resolve().parents[2]


def readme_python() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_example_runs_as_written(registered_pod):
    pod = registered_pod
    examples = readme_python()
    assert examples, "the README shows the client library"
    env = {**os.environ, "VIPU_CLI_API_HOST": "127.0.0.1", "VIPU_CLI_API_PORT": str(pod.user_port)}
    for example in examples:
        done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["8 partitions of 4 IPUs fit now", "[0, 1, 2, 3]"]
    assert pod.user("list", "partitions", "--json").out.strip() == '{\n  "partitions": []\n}'


def test_the_clients_give_typed_results_and_the_error_families(registered_pod):
    pod = registered_pod
    with UserClient.connect("127.0.0.1", pod.user_port) as user, AdminClient.connect("127.0.0.1", pod.admin_port) as admin:
        user.create_partition("lib", size=8, num_gcds=2)
        assert [p.id for p in user.list_partitions()] == ["lib"]
        assert len(user.ipuof_config("lib").gcd_configs) == 2
        assert [a.id for a in admin.list_allocations()] == ["alloc-1"]
        assert admin.capacity(4).fitting == 6
        with pytest.raises(AlreadyExists, match="lib"):
            user.create_partition("lib", size=1)
        user.remove_partition("lib")
        assert user.list_partitions() == []
