"""The example workloads: real LightningModules and DataModules that need no download.

They are what the shipped configs train (``model=char_gpt data=stdlib_text``, ``model=demo``), what
the examples and tests run, and a template for a user's own classes; the plugins themselves never
import them. Until lightning_field 0.1.0 they lived at the package root (``lightning_field.char_gpt``,
``lightning_field.demo``), and checkpoints written then record those ``_target_`` names in their
stored config: :data:`MOVED_TARGETS` says where each one went.

Importing this package imports nothing else, so the resume check and the Hydra apps can read the
table without torch.
"""

from __future__ import annotations

from typing import Any

MOVED_TARGETS: dict[str, str] = {
    "lightning_field.char_gpt.CharGPT": "lightning_field.workloads.char_gpt.CharGPT",
    "lightning_field.char_gpt.StdlibTextDataModule": "lightning_field.workloads.stdlib_text.StdlibTextDataModule",
    "lightning_field.demo.DemoRegressor": "lightning_field.workloads.demo.DemoRegressor",
    "lightning_field.demo.DemoShardedRegressor": "lightning_field.workloads.demo.DemoShardedRegressor",
    "lightning_field.demo.DemoDataModule": "lightning_field.workloads.demo.DemoDataModule",
}
"""Old ``_target_`` -> the class's current path: the one table of moved targets.

Three places read it, each for one reason:

- the resume check (``state.provenance_compare.diff_provenance``) treats a checkpoint's old ``_target_``
  and the current one as the same value, so a checkpoint written before the move still resumes.
  Only these exact names are equated; every other config difference still refuses the resume;
- the Hydra apps (``integrations.hydra_configs.apply_target_swaps``) refuse an old name given on
  the command line or in a YAML file, before anything runs, with the new name to write instead.
  No alias module is kept at the old path: a config that names a class one way records it one way;
- the release record (``record.identity.project_config``) hashes configs with current targets
  (:func:`with_current_targets`), so evidence and the released run compare by what they trained.

A class that moves again gets its old names added here, pointing at its newest path.
"""


def current_target(target: str) -> str:
    """The current path of a ``_target_`` (unchanged when it never moved)."""
    return MOVED_TARGETS.get(target, target)


def with_current_targets(config: Any) -> Any:
    """``config`` (plain data) with every moved ``_target_`` replaced by its current path.

    For comparisons by hash (the release record's config identity), where the resume check's
    key-by-key equivalence cannot apply: the same workload then hashes alike before and after a move.
    """
    if isinstance(config, dict):
        return {
            key: current_target(value) if key == "_target_" and isinstance(value, str) else with_current_targets(value)
            for key, value in config.items()
        }
    if isinstance(config, list):
        return [with_current_targets(value) for value in config]
    return config
