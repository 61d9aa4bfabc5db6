"""`vipu-web` refuses what it cannot serve in one line of its own: a taken port, a missing extra."""

from __future__ import annotations

import socket
import sys

from click.testing import CliRunner

from vipu.web import main


def test_a_taken_port_is_refused_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main.main, ["--listen-address", "127.0.0.1", "--port", str(port)])
    assert result.exit_code == 2
    assert result.output == f"vipu-web: cannot listen on 127.0.0.1:{port}: the port is taken\n"


def test_without_its_extra_it_says_which_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if `pip install vipu` had not installed it
    result = CliRunner().invoke(main.main, ["--port", "1"])
    assert result.exit_code == 2
    assert result.output == "vipu-web: the dashboard needs vipu's web extra (uvicorn is missing): pip install 'vipu[web]'\n"
