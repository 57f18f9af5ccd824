"""ManifestCheckpoint's own options come in four groups (storage, snapshots, resume, interrupts), each a
dataclass that refuses a bad value when it is written; 0.x's flat keywords keep working, each with a
DeprecationWarning that names its new spelling, and build the very same callback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from lightning_field import (
    FailureModel,
    InterruptConfig,
    ManifestCheckpoint,
    ResumeConfig,
    SnapshotConfig,
    StorageConfig,
)
from lightning_field.checkpoint.options import FLAT_NAMES, GROUPS
from lightning_field.checkpoint.stores import LocalStore

# One value per flat name of 0.x, none of them a default, so a name that reached nowhere shows.
FLAT_VALUES: dict[str, object] = {
    "storage_options": {"anon": True},
    "upload_part_bytes": 16 << 20,
    "upload_concurrency": 3,
    "async_save": True,
    "on_save_error": "warn",
    "store": LocalStore(),
    "snapshot_every_n_train_steps": 7,
    "snapshot_dir": "/tmp/elsewhere",
    "snapshot_in_line": False,
    "snapshot_overhead_budget": 0.05,
    "allow_resume_mismatch": ["world_size"],
    "allow_changed": ["precision"],
    "resume_inexact": True,
    "require_fresh": False,  # True needs a signing key: its default is checked by ResumeConfig below
    "max_failed_attempts": 5,
    "trust_pickles": True,
    "preemption_signals": [10],
    "preemption_check_every_n_steps": 4,
    "save_on_stop": False,
    "save_on_train_end": True,
}


def _observable(checkpoint: ManifestCheckpoint) -> dict[str, object]:
    """What each option sets on the callback, as its own code reads it back."""
    return {
        "storage_options": checkpoint.storage_options,
        "part_bytes": checkpoint._checkpointer._object_store.part_bytes,
        "concurrency": checkpoint._checkpointer._object_store.max_concurrency,
        "async_save": checkpoint.async_save,
        "on_save_error": checkpoint.on_save_error,
        "store": checkpoint._checkpointer._given_store,
        "snapshot_every": checkpoint.snapshots.requested,
        "snapshot_dir": checkpoint.snapshots.directory,
        "snapshot_in_line": checkpoint.snapshots.commits_in_line,
        "overhead_budget": schedule.interval.budget if (schedule := checkpoint.snapshots.schedule) else None,
        "allow_resume_mismatch": checkpoint.allow_resume_mismatch,
        "allow_changed": checkpoint._guard.allow_changed,
        "resume_inexact": checkpoint.resume_inexact,
        "require_fresh": checkpoint.freshness.required,
        "max_failed_attempts": checkpoint._no_progress.max_failed_attempts,
        "trust_pickles": checkpoint.trust_pickles,
        "signals": checkpoint._preemption._watcher.signals,
        "check_every": checkpoint.preemption_check_every_n_steps,
        "save_on_stop": checkpoint.save_on_stop,
        "save_on_train_end": checkpoint.save_on_train_end,
    }


def test_every_flat_name_of_0x_builds_the_same_callback_as_its_group_and_warns_with_the_new_spelling() -> None:
    assert set(FLAT_VALUES) == set(FLAT_NAMES), "a flat name without a value here is not checked"
    grouped: dict[str, dict[str, object]] = {}
    for name, value in FLAT_VALUES.items():
        group, field = FLAT_NAMES[name]
        grouped.setdefault(group, {})[field] = value
    new = ManifestCheckpoint(dirpath="ckpts", **{g: GROUPS[g](**fields) for g, fields in grouped.items()})
    with pytest.warns(DeprecationWarning) as caught:
        old = ManifestCheckpoint(dirpath="ckpts", **FLAT_VALUES)
    said = [str(w.message) for w in caught]
    for name, (group, field) in FLAT_NAMES.items():
        spelling = f"ManifestCheckpoint({name}=...) is deprecated; use ManifestCheckpoint({group}="
        assert any(s.startswith(spelling) and f"({field}=...))" in s for s in said), name
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    assert _observable(old) == _observable(new)
    default = _observable(ManifestCheckpoint(dirpath="ckpts"))
    unchanged = {key for key, value in _observable(new).items() if value == default[key]}
    assert unchanged == {"require_fresh"}, "each option reaches what it sets (require_fresh is given its default)"


def test_the_grouped_form_warns_about_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ManifestCheckpoint(
            dirpath="ckpts",
            storage=StorageConfig(async_save=True),
            snapshots=SnapshotConfig(every_n_train_steps=None),
            resume=ResumeConfig(allow_mismatch=["config"]),
            interrupts=InterruptConfig(save_on_train_end=True),
            failures=FailureModel(mtbf_hours=2.0),
        )


def test_a_flat_name_and_its_group_setting_one_option_two_ways_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"snapshot_dir='/tmp/b' and snapshots.directory='/tmp/a' set the same"):
        ManifestCheckpoint(snapshots=SnapshotConfig(directory="/tmp/a"), snapshot_dir="/tmp/b")


def test_a_flat_name_fills_a_field_its_group_leaves_at_the_default_as_a_shipped_hydra_config_does() -> None:
    # field-train's YAML fills every group; a 0.x `+callbacks.checkpoint.snapshot_dir=...` arrives beside it.
    with pytest.warns(DeprecationWarning, match=r"snapshot_dir=\.\.\.\) is deprecated"):
        checkpoint = ManifestCheckpoint(snapshots=SnapshotConfig(every_n_train_steps=3), snapshot_dir="/tmp/x")
    assert checkpoint.snapshots.directory == "/tmp/x" and checkpoint.snapshots.requested == 3


def test_a_misspelled_model_checkpoint_argument_is_pointed_at_that_argument_not_at_an_option_group() -> None:
    meant_by = {"every_n_train_step": "every_n_train_steps", "save_topk": "save_top_k", "monitr": "monitor"}
    for typo, meant in meant_by.items():
        with pytest.raises(TypeError, match=rf"did you mean {meant} for '{typo}'\?\)$"):
            ManifestCheckpoint(**{typo: 3})


def test_the_same_value_given_flat_and_in_its_group_is_one_setting_not_a_conflict() -> None:
    with pytest.warns(DeprecationWarning):
        checkpoint = ManifestCheckpoint(
            resume=ResumeConfig(allow_mismatch=["config"]), allow_resume_mismatch=["config"],
            interrupts=InterruptConfig(signals=[10]), preemption_signals=[10],
        )  # fmt: skip
    assert checkpoint.allow_resume_mismatch == ("config",) and checkpoint._preemption._watcher.signals == (10,)


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: InterruptConfig(signals=15), r"interrupts\.signals .* got 15"),
        (lambda: InterruptConfig(signals=["SIGTERM"]), r"interrupts\.signals .* got \['SIGTERM'\]"),
        (lambda: InterruptConfig(signals=[0, 999]), r"interrupts\.signals"),
        (lambda: InterruptConfig(signals=[9]), r"interrupts\.signals must be a list of signal numbers a handler can"),
        (lambda: ResumeConfig(allow_mismatch=None), r"resume\.allow_mismatch must be a name or a list of names"),
        (lambda: ResumeConfig(allow_changed=[1]), r"resume\.allow_changed must be a name or a list of names"),
        (lambda: StorageConfig(options="endpoint"), r"storage\.options must be a mapping"),
        (lambda: StorageConfig(upload_part_bytes=1.5e8), r"storage\.upload_part_bytes must be an integer"),
    ],
    ids=["signals-int", "signals-names", "signals-unknown", "signals-sigkill", "mismatch-none", "changed-int",
         "options-str", "part-float"],
)  # fmt: skip
def test_a_malformed_option_is_refused_naming_its_group_and_field(build: Any, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        build()


@pytest.mark.parametrize("typo", ["snapshot_every_n_train_step", "snapshot_every"])
def test_an_unknown_keyword_is_a_type_error_that_suggests_the_new_spelling(typo: str) -> None:
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{typo}'") as refused:
        ManifestCheckpoint(**{typo: 3})
    assert "ManifestCheckpoint(snapshots=SnapshotConfig(every_n_train_steps=...))" in str(refused.value)


def test_storage_options_stay_out_of_the_repr_where_their_credentials_would_show() -> None:
    options = StorageConfig(options={"key": "AKIA-EXAMPLE", "secret": "hunter2"})
    assert "hunter2" not in repr(options) and "AKIA" not in repr(options)
    assert hash(options) == hash(StorageConfig(options={"other": 1}))  # hashable, options aside


def test_a_group_may_be_a_mapping_of_its_fields_as_hydra_and_lightning_cli_pass_it() -> None:
    checkpoint = ManifestCheckpoint(snapshots={"every_n_train_steps": 2}, resume={"allow_mismatch": "config"})
    assert checkpoint.snapshots.every_n_train_steps == 2
    assert checkpoint.allow_resume_mismatch == ("config",)  # one name, not its letters
    with pytest.raises(TypeError, match=r"snapshots: SnapshotConfig has no field 'every'"):
        ManifestCheckpoint(snapshots={"every": 2})
    with pytest.raises(TypeError, match=r"resume must be a ResumeConfig, a mapping of its fields or None, got int"):
        ManifestCheckpoint(resume=3)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SnapshotConfig(every_n_train_steps=0), r"snapshots.every_n_train_steps must be 'auto'"),
        (lambda: SnapshotConfig(overhead_budget=1.5), r"snapshots.overhead_budget must be a share"),
        (lambda: StorageConfig(upload_part_bytes=1024), r"storage.upload_part_bytes must be an integer >= 5 MiB"),
        (lambda: StorageConfig(upload_concurrency=0), r"storage.upload_concurrency must be an integer >= 1"),
        (lambda: StorageConfig(on_save_error="later"), r"storage.on_save_error must be one of"),
        (lambda: ResumeConfig(max_failed_attempts=0), r"resume.max_failed_attempts must be None or an integer"),
        (lambda: ResumeConfig(allow_changed=["acumulate_grad_batches"]), r"'acumulate_grad_batches', not a Trainer"),
        (lambda: InterruptConfig(check_every_n_steps=0), r"interrupts.check_every_n_steps must be None or an"),
    ],
)
def test_each_group_refuses_a_bad_value_when_it_is_written_naming_group_and_field(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_a_count_of_any_integer_type_is_taken_as_a_plain_int_and_a_bool_or_a_float_is_not() -> None:
    import numpy as np

    assert ResumeConfig(max_failed_attempts=np.int64(4)).max_failed_attempts == 4
    assert type(InterruptConfig(check_every_n_steps=np.int32(2)).check_every_n_steps) is int
    assert StorageConfig(upload_part_bytes=np.int64(8 << 20)).upload_part_bytes == 8 << 20
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match=r"interrupts\.check_every_n_steps must be None or an integer >= 1"):
            InterruptConfig(check_every_n_steps=bad)


def test_the_groups_are_frozen_and_their_defaults_are_the_callbacks_defaults() -> None:
    options = SnapshotConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.every_n_train_steps = 3  # type: ignore[misc]
    assert _observable(ManifestCheckpoint(dirpath="ckpts")) == {  # 0.x's defaults, written out
        "storage_options": {},
        "part_bytes": 64 << 20,
        "concurrency": 8,
        "async_save": False,
        "on_save_error": "stop",
        "store": None,
        "snapshot_every": "auto",
        "snapshot_dir": None,
        "snapshot_in_line": None,
        "overhead_budget": 0.01,
        "allow_resume_mismatch": (),
        "allow_changed": frozenset(),
        "resume_inexact": False,
        "require_fresh": False,
        "max_failed_attempts": 3,
        "trust_pickles": False,
        "signals": (15, 10),
        "check_every": None,
        "save_on_stop": True,
        "save_on_train_end": False,
    }


@pytest.mark.slow  # a fresh interpreter, to see what the import alone pulls in
def test_the_options_import_without_lightning(tmp_path: Path) -> None:
    code = (
        "import sys; import lightning_field.checkpoint.options as o; o.SnapshotConfig(every_n_train_steps=3);"
        "print(sorted(m for m in sys.modules if m == 'lightning' or m.startswith(('lightning.', 'torch'))))"
    )
    # A cold interpreter: the suite's warm one has Lightning imported already.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_flat_names_map_onto_real_fields_of_their_groups() -> None:
    for name, (group, field) in FLAT_NAMES.items():
        assert field in {f.name for f in dataclasses.fields(GROUPS[group])}, name
    module = sys.modules["lightning_field.checkpoint.options"]
    assert set(module.__all__) <= set(dir(module))  # every public name exists
