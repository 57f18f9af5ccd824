"""Where earlier versions defined the store protocol: the names stay importable from here for the
stores users wrote against it. They live in :mod:`lightning_field.checkpoint.stores`."""

from lightning_field.checkpoint.stores.base import (
    CheckpointReader,
    CheckpointStore,
    CheckpointWriter,
    RankOutcome,
    Receipt,
    describe_error,
)

__all__ = ["CheckpointReader", "CheckpointStore", "CheckpointWriter", "RankOutcome", "Receipt", "describe_error"]
