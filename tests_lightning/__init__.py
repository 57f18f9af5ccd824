"""Run Lightning's own ModelCheckpoint tests against ``ManifestCheckpoint`` (a developer tool).

``python tests_lightning/run.py`` (see ``docs/testing.md``). Nothing of Lightning is copied here: the
upstream test files are located or fetched at run time, outside this repository.
"""
