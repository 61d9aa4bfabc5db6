"""Which process is a vPOD's controller: one this orchestrator is starting is never taken for an
orphan to adopt, though the supervisor looks without the vPOD's lock while it starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.functional.harness import wait_until
from vipu.vpod import tenants
from vipu.vpod.store import Vpod
from vipu.vpod.tenants import LocalControllers


def test_a_controller_being_started_is_not_adopted_by_a_look_between_its_start_and_its_pid_file(tmp_path, monkeypatch, caplog):
    program = tmp_path / "vipu-server"
    program.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    program.chmod(0o755)
    controllers = LocalControllers(tmp_path / "vpod", site=None)  # type: ignore[arg-type]
    controllers.server_program = program
    vpod = Vpod("acme-1", "acme", "Creating", "prepared", ["m01"], "mesh", 1, "acme", [9100, 9101, 9102])
    controllers.directory(vpod.id).mkdir(parents=True)
    starting = subprocess.Popen
    looked: list[bool] = []

    def start_then_look(*args, **kwargs):
        process = starting(*args, **kwargs)
        directory = str(controllers.directory(vpod.id)).encode()
        wait_until(lambda: directory in Path(f"/proc/{process.pid}/cmdline").read_bytes(), timeout=10,
                   what="the new process's command line (until it has exec'd, /proc shows the parent's)")
        looked.append(controllers.alive(vpod.id))  # the supervisor, before the launch has registered its child
        return process

    monkeypatch.setattr(tenants.subprocess, "Popen", start_then_look)
    caplog.set_level(logging.WARNING, logger=tenants.__name__)
    controllers._launch(vpod)
    pid = controllers._pid(vpod.id)
    try:
        assert looked == [True]  # it runs: the supervisor does not start another
        assert not [r for r in caplog.records if "adopting" in r.getMessage()]
        assert pid is not None and (controllers.directory(vpod.id) / "controller.pid").read_text() == str(pid)
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            controllers._children[vpod.id].wait(timeout=10)
