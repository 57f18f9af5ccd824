"""The Lightning releases lightning_field is tested with, refused otherwise before any private name is touched.

Every other ``compat/lightning_*`` module imports this one first: a newer release may move a private
name or fix a quirk that lightning_field corrects a second time, and exact resume would then break
silently instead of failing with the fix.
"""

from __future__ import annotations

import lightning.pytorch as pl
from packaging.specifiers import SpecifierSet

TESTED_LIGHTNING = ">=2.6,<2.7"
"""The Lightning releases every workaround in ``compat/`` was written against and tested with
(``pyproject.toml`` pins the same range). A newer release may move a private name or fix a quirk
this package corrects twice, and exact resume would break silently, so it is refused at import."""


def unsupported_lightning(version: str, tested: str = TESTED_LIGHTNING) -> str | None:
    """Why ``version`` of Lightning cannot be used (None when it is in the tested range)."""
    if SpecifierSet(tested).contains(version, prereleases=True):
        return None
    return (
        f"lightning_field is tested with Lightning {tested} and reaches into its private loop and"
        f" checkpoint internals (lightning_field/compat/); Lightning {version} is"
        " installed. Install a tested release (pip install 'lightning" + tested + "') or a"
        " lightning_field release that supports yours."
    )


_problem = unsupported_lightning(pl.__version__)
if _problem is not None:
    raise ImportError(_problem)
