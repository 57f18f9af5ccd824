"""Hydra configs shipped with lightning_field, under their own namespace: ``lightning_field/<group>``.

Search-path root ``pkg://lightning_field.conf``; the ``field-*`` apps use ``lightning_field/`` itself
as their primary config directory, so there the groups read ``callbacks=field``, ``trainer=ddp_cpu``.
"""
