"""The layering of pyproject.toml's import-linter contracts holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter)], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout
