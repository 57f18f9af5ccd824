"""The Lightning range this library reaches into is declared once and enforced: pip installs only a
tested release, and an untested one is refused at import, with the fix, instead of resuming wrongly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lightning

from lightning_field.checkpoint.lightning_internals import TESTED_LIGHTNING, unsupported_lightning

REPO = Path(__file__).resolve().parent.parent


def test_pyproject_pins_the_tested_lightning_range_and_the_installed_release_is_in_it() -> None:
    pins = re.findall(r'^\s*"lightning([<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert pins == [TESTED_LIGHTNING]
    assert unsupported_lightning(lightning.__version__) is None, unsupported_lightning(lightning.__version__)


def test_an_untested_lightning_is_refused_at_import_with_the_fix() -> None:
    assert unsupported_lightning("2.5.6") is not None and unsupported_lightning("2.7.0rc1") is not None
    code = "import lightning.pytorch as pl; pl.__version__ = '2.7.0'; import lightning_field.checkpoint"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"ImportError: lightning_field is tested with Lightning {TESTED_LIGHTNING}" in result.stderr
    assert "Lightning 2.7.0 is installed. Install a tested release (pip install 'lightning>=2.6,<2.7')" in (
        result.stderr
    )
