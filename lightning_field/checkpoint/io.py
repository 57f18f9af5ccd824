"""Loading manifest checkpoints through Lightning's own restore path.

``ManifestCheckpoint`` installs this around the strategy's CheckpointIO during ``setup``, so
``trainer.fit(ckpt_path=...)`` with a checkpoint directory is verified before anything is
unpickled, merges this rank's own RNG and data position, and refuses a resume into a different run.
Plain ``.ckpt`` files are passed through to the wrapped CheckpointIO unchanged. The load itself is
the Lightning-free :func:`~lightning_field.checkpoint.load.load_from_store`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO

from lightning_field.checkpoint.load import load_from_store, load_on_every_rank
from lightning_field.checkpoint.stores import CheckpointStore, checkpoint_location, is_checkpoint, store_for
from lightning_field.checkpoint.stores.local import advertised_checkpoint
from lightning_field.checkpoint.verify import VerifyReport
from lightning_field.core.manifest import Manifest
from lightning_field.core.storage import Location, as_location


class ManifestCheckpointIO(CheckpointIO):
    """Args:
    inner: the CheckpointIO plain ``.ckpt`` files go through.
    on_manifest: called with the manifest before anything is unpickled; may refuse by raising.
    store_at: the store that reads and removes the checkpoint at a location (default:
        :func:`~lightning_field.checkpoint.stores.store_for` without storage options); the
        callback passes its own, with its storage options or the store it was given.
    trust_pickles: load a manifest checkpoint's files with a full unpickle where they need one
        (:mod:`~lightning_field.checkpoint.safe_load`); Lightning's ``weights_only`` applies to
        plain ``.ckpt`` files only.
    verified: this process's verification of a checkpoint, if any (the one the resolver picked),
        so that the load hashes nothing the resolver already hashed.
    on_loaded: called with every loaded checkpoint dict, of either kind, before Lightning reads it.
    """

    def __init__(
        self,
        inner: CheckpointIO,
        on_manifest: Callable[[Manifest, Location], None] | None = None,
        store_at: Callable[[Location], CheckpointStore] | None = None,
        trust_pickles: bool = False,
        verified: Callable[[Location], VerifyReport | None] | None = None,
        on_loaded: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.inner = inner
        self.on_manifest = on_manifest
        self.store_at = store_at or store_for
        self.trust_pickles = trust_pickles
        self.verified = verified
        self.on_loaded = on_loaded

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        # ``trainer.save_checkpoint("x.ckpt")`` by the user keeps working as a plain export.
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        location = checkpoint_location(path)  # the folder behind an advertised <name>.ckpt: verified, merged
        store = self.store_at(location)
        if not is_checkpoint(location, store=store):
            loaded = self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        else:
            earlier = self.verified(location) if self.verified is not None else None
            loaded = load_on_every_rank(
                path,
                lambda: load_from_store(store, location, map_location, self.on_manifest, self.trust_pickles, earlier),
            )
        if self.on_loaded is not None and isinstance(loaded, dict):
            self.on_loaded(loaded)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        # An advertised <name>.ckpt goes with its folder; another name of it (a last.ckpt) goes alone.
        # An object store's <prefix>/state.pt names the prefix: it goes whole.
        location = as_location(path)
        if isinstance(location, Path) and location.is_file():
            location = advertised_checkpoint(location) or location
        elif not isinstance(location, Path):
            location = checkpoint_location(location)
        if isinstance(location, Path) and location.is_file():
            self.inner.remove_checkpoint(path)  # a plain ``.ckpt``: Lightning's own
        else:
            self.store_at(location).remove(location)

    def teardown(self) -> None:
        self.inner.teardown()
