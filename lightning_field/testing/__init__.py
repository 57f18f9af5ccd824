"""Exact resume as a test in your own suite: ``assert_resumes_exactly`` and its pytest plugin.

Importing this package is cheap; torch and Lightning are imported when a check runs.
"""

from lightning_field.testing.resume import (
    KILL_POSITIONS,
    ResumeCheckFailed,
    ResumeEvidence,
    assert_resumes_exactly,
    import_path,
)

__all__ = ["KILL_POSITIONS", "ResumeCheckFailed", "ResumeEvidence", "assert_resumes_exactly", "import_path"]
