"""Where earlier versions defined :class:`ObjectStore`: importable from here still. It lives in
:mod:`lightning_field.checkpoint.stores.object`."""

from lightning_field.checkpoint.stores.object import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES, ObjectStore

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_PART_BYTES", "ObjectStore"]
