"""The checkpoint core in a training loop without Lightning: ``Checkpointer`` saves and restores
named ``Stateful`` objects (a model, an optimizer, a scheduler) with every rank's RNG, through the
same commit, verification and retention as ``ManifestCheckpoint``.

Run it twice: the second run continues bitwise where the first stopped::

    python examples/plain_loop.py --dirpath /tmp/plain-loop --steps 20
    python examples/plain_loop.py --dirpath /tmp/plain-loop --steps 40
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from lightning_field import Checkpointer


def train(dirpath: str, steps: int, save_every: int = 5) -> tuple[int, dict[str, torch.Tensor]]:
    """Train to ``steps``, continuing from the newest recoverable checkpoint under ``dirpath``;
    the step it started from, and the weights it ended with."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
    states = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    checkpointer = Checkpointer(dirpath, keep=2)
    restored = checkpointer.restore(states, missing_ok=True)  # None on the first run: from step 0
    first = restored.step if restored else 0
    for step in range(first, steps):
        inputs = torch.linspace(-1, 1, 8 * 16).reshape(16, 8) * (1 + step % 3)
        loss = (model(inputs) - inputs.sum(1, keepdim=True)).pow(2).mean()  # dropout draws from the RNG
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if (step + 1) % save_every == 0 or step + 1 == steps:
            checkpointer.save(states, step=step + 1)
    return first, model.state_dict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirpath", required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    first, _ = train(args.dirpath, args.steps)
    print(f"trained from step {first} to step {args.steps}; checkpoints under {args.dirpath}")
