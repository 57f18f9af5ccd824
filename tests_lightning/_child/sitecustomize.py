"""Applies the swap in child interpreters of a ``tests_lightning`` run (``ddp_spawn`` workers).

On ``PYTHONPATH`` only while ``tests_lightning.swap_plugin`` runs (it puts this folder there); acts only
where ``TL_CHILD_SETTINGS`` is set, and only once the process first imports Lightning's ``tests_pytorch``
(as unpickling a test's callback does), so that the test module sees what the pytest process saw.
"""

import os
import sys

if os.environ.get("TL_CHILD_SETTINGS"):

    class _ApplyBeforeLightningTests:
        def find_spec(self, name, path=None, target=None):
            if name == "tests_pytorch" or name.startswith("tests_pytorch."):
                sys.meta_path.remove(self)
                from tests_lightning import swap_plugin

                swap_plugin.apply_from_env()
            return None

    sys.meta_path.insert(0, _ApplyBeforeLightningTests())
