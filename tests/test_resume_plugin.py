"""Exact resume in a user's own suite: the pytest plugin and ``assert_resumes_exactly``, run the way a
user runs them, through pytest's own ``pytester`` on the user's test files in a fresh pytest process.

The shipped example (``examples/resume_in_ci/test_resume_exactly.py``) is one of those files: an
ordinary module (AdamW, OneCycleLR sized by ``estimated_stepping_batches``, dropout, ``self.log`` per
epoch) must pass mid-epoch, at an epoch end, with Python randomness in two loader workers, and on
two DDP ranks. Its twin with a hidden Python counter must fail, naming the step and the component.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from lightning_field.testing import import_path
from lightning_field.testing.resume import resolve_kill_steps, steps_per_epoch

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "resume_in_ci" / "test_resume_exactly.py"

HIDDEN_STATE = '''
import pytest
from test_resume_exactly import RegressionData, Regressor


class CountingRegressor(Regressor):
    """A refactor that added state outside every state_dict: a Python counter that scales the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        return super().training_step(batch, batch_idx) * (1.0 + 0.01 * self.calls)


def test_a_hidden_counter_does_not_resume(field_evidence):
    field_evidence(CountingRegressor, RegressionData)


def test_a_lambda_factory_is_refused_with_the_fix(field_evidence):
    with pytest.raises(TypeError, match="is a lambda; each run is a separate process that imports it by name"):
        field_evidence(lambda: Regressor(), RegressionData)


def test_an_ordinary_unit_test():
    pytest.fail("-m resume must deselect a test that does not use the fixture")
'''


@pytest.fixture(scope="module")
def user_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project: the shipped example and a model with hidden state, as two test files."""
    root = tmp_path_factory.mktemp("user_suite")
    shutil.copy(EXAMPLE, root / EXAMPLE.name)
    (root / "test_hidden_state.py").write_text(HIDDEN_STATE)
    return root


@pytest.mark.slow
def test_through_pytester_honest_code_passes_everywhere_and_a_hidden_counter_fails_naming_step_and_component(
    pytester: pytest.Pytester, user_suite: Path
) -> None:
    for path in user_suite.iterdir():
        shutil.copy(path, pytester.path / path.name)
    options = ["-p", "no:cacheprovider", "-v", "--tb=short", "-m", "resume", "--field-keep=kept"]
    result = pytester.runpytest_subprocess(*options, timeout=600)
    out = result.stdout.str()
    # -m resume: the fixture marked the checks; the ordinary unit test was deselected.
    result.assert_outcomes(passed=4, failed=1, deselected=1)
    for passed in (
        "test_resume_exactly.py::test_the_regressor_resumes_exactly_mid_epoch_and_at_an_epoch_end PASSED",
        "test_resume_exactly.py::test_python_randomness_in_two_loader_workers_resumes_exactly PASSED",
        "test_resume_exactly.py::test_the_regressor_resumes_exactly_on_two_ddp_ranks PASSED",
        "test_hidden_state.py::test_a_lambda_factory_is_refused_with_the_fix PASSED",
    ):
        assert passed in out, out[-3000:]
    # The failure: the step after the resume, in the loss (the counter restarted at zero), and the bundle.
    lines = result.stdout.lines
    start = next((i for i, line in enumerate(lines) if line.startswith("E") and "ResumeCheckFailed: " in line), None)
    assert start is not None, out[-4000:]
    message = [lines[start].split("ResumeCheckFailed: ", 1)[1]]
    message += [line[1:].strip() for line in lines[start + 1 :] if line.startswith("E ")][:30]
    text = "\n".join(message)
    assert "test_hidden_state.CountingRegressor does not resume exactly" in text, text
    assert re.search(r"interrupted-1 vs control-1, resumed from step 4: first divergence at step 5 \(epoch 0,"
                     r" batch 4, rank 0\): loss", text), text  # fmt: skip
    assert "control-2 vs control-1: identical" in text
    assert re.search(r"evidence: \S+/resume-evidence-1/evidence\.md", text), text
    assert len([line for line in lines[start:] if line.startswith("E ")]) <= 12, "the message fits on one screen"
    # --field-keep kept the failing check's bundle, and only that one.
    kept = sorted(p.relative_to(pytester.path / "kept") for p in (pytester.path / "kept").glob("*/*/evidence.md"))
    assert [p.parts[0] for p in kept] == ["test_hidden_state.py_test_a_hidden_counter_does_not_resume"], kept
    assert "kept evidence of failing resume checks" in out


@pytest.mark.slow
def test_the_plugin_imports_no_torch_while_collecting_a_suite_that_does_not_use_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import sys\n"
        "def pytest_collection_finish(session):\n"
        "    print('TORCH_AT_COLLECTION', 'torch' in sys.modules, 'lightning' in sys.modules)\n"
    )
    pytester.makepyfile(test_plain="def test_one():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--markers")
    assert "@pytest.mark.resume: an exact-resume check (lightning_field)" in result.stdout.str()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1)
    assert "TORCH_AT_COLLECTION False False" in result.stdout.str()


# ---------------------------------------------------------------------------------------------- the parts
def module_level_factory() -> None:
    """Named by import path: fine."""


def test_factories_must_be_importable_by_name_in_another_process() -> None:
    assert import_path(module_level_factory, "module") == f"{__name__}.module_level_factory"
    assert import_path("lightning.pytorch.demos.boring_classes:BoringModel", "module") == (
        "lightning.pytorch.demos.boring_classes.BoringModel"
    )

    def nested() -> None: ...

    with pytest.raises(TypeError, match=r"nested is defined inside a function; .*module level"):
        import_path(nested, "module")
    with pytest.raises(ImportError, match=r"data 'no_such_pkg.Data' does not import"):
        import_path("no_such_pkg.Data", "data")
    nested.__module__ = "__main__"
    nested.__qualname__ = "nested"
    with pytest.raises(TypeError, match=r"defined in __main__ \(a script run directly\)"):
        import_path(nested, "module")


def test_named_kill_positions_land_inside_an_epoch_or_at_its_end_after_the_first_checkpoint() -> None:
    records = [{"epoch": s // 5, "step": s + 1} for s in range(12)]  # 5 steps per epoch
    assert steps_per_epoch(records, 12) == 5
    assert steps_per_epoch([{"epoch": 0, "step": s} for s in range(1, 9)], 8) is None
    # every 2 steps a checkpoint: mid-epoch is step 3 (inside epoch 0, not a checkpoint step), epoch-end 5
    assert resolve_kill_steps(["mid-epoch", "epoch-end", 7], 5, 12, 2) == [3, 5, 7]
    assert resolve_kill_steps(["mid-epoch"], None, 8, 2) == [5]  # no epoch ended: the middle of the run
    with pytest.raises(ValueError, match=r"kill_at='epoch-end' needs an epoch to end within the run"):
        resolve_kill_steps(["epoch-end"], None, 8, 2)
    with pytest.raises(ValueError, match=r"kill_at='mid-epoch' needs a step inside an epoch"):
        resolve_kill_steps(["mid-epoch"], 2, 8, 2)


def test_bad_arguments_are_named_before_anything_runs(tmp_path: Path) -> None:
    from lightning_field.testing import assert_resumes_exactly

    boring = "lightning.pytorch.demos.boring_classes.BoringModel"
    with pytest.raises(ValueError, match=r"kill_at='soon' is not a named position"):
        assert_resumes_exactly(boring, kill_at="soon", bundle_dir=tmp_path / "a")
    with pytest.raises(ValueError, match=r"devices must be 1 or 2"):
        assert_resumes_exactly(boring, devices=4, bundle_dir=tmp_path / "b")
    with pytest.raises(ValueError, match=r"tolerance must be 'exact', 'noise' or a noise multiplier"):
        assert_resumes_exactly(boring, tolerance="loose", bundle_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"trainer=\{max_steps: \.\.\.\} is set by the check itself"):
        assert_resumes_exactly(boring, trainer={"max_steps": 3}, bundle_dir=tmp_path / "d")
    assert not any(tmp_path.iterdir()), "nothing ran"
