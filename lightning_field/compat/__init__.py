"""Every private name of another package that lightning_field touches, in one place.

``lightning.py`` (Lightning's loop, data and checkpoint internals), ``torch.py`` (serialization,
autograd's write counter, DTensor, samplers) and ``wandb.py`` (WandbLogger's run handle and init
arguments). Each accessor says what it works around and for which versions; ``pyproject.toml``
pins the Lightning range they were tested with, and ``compat/lightning.py`` refuses any other at
import. No module outside this package reaches into another package's private names
(``tests/test_compat.py`` checks).
"""
