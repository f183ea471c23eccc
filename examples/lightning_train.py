"""A PyTorch Lightning script made ready for dlsub: ``callbacks=[DlsubCallback(every_n_steps=50)]``, and
``**trainer_args()`` for a job of more than one process.

A tiny regression model on generated data (nothing downloaded). Run it
as it is (``python examples/lightning_train.py``), under torchrun, or
through ``dlsub examples/lightning_train.py``: stopped by dlsub (a time
limit, a move, a resize), it saves through Lightning and exits "resume me";
the next attempt continues at the step it stopped. Works with
``pytorch_lightning`` in place of ``lightning`` (change the imports).
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from dlsub.checkpointing.lightning import DlsubCallback, trainer_args


class Regression(L.LightningModule):
    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(samples: int = 256, features: int = 16) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator) + 0.1 * torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=32)


def main(argv: list[str] | None = None, callbacks: list[Any] | None = None) -> Regression:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=50,
                        help="steps between checkpoints (the agent moves a job only once it has one)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = Regression()
    # trainer_args(): as many processes as torchrun started (an elastic job's change from group to group);
    # accelerator="auto": the GPU where the job has one, the CPU on a CPU partition.
    trainer = L.Trainer(max_steps=args.max_steps, accelerator="auto", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[*(callbacks or []), DlsubCallback(every_n_steps=args.save_every)],
                        **trainer_args())
    trainer.fit(model, data())
    return model


if __name__ == "__main__":
    main()
