"""A Hugging Face Trainer script made ready for dlsub: a callback, and one line to resume.

A tiny GPT-2 built from a config (no download: ``HF_HUB_OFFLINE=1`` is
fine) trained on generated token sequences. Run it as it is (``python
examples/hf_trainer_train.py``), under torchrun, or through ``dlsub
examples/hf_trainer_train.py``: stopped by dlsub, the Trainer saves its own
``checkpoint-N`` and the process exits "resume me"; the next attempt resumes
from the newest complete one.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from dlsub.checkpointing.hf_trainer import DlsubCallback


class Sequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Counting sequences mod the vocabulary from random starts: learnable, generated, the same every run."""

    def __init__(self, count: int = 256, length: int = 16, vocab: int = 64) -> None:
        starts = torch.randint(0, vocab, (count, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None, callbacks: list[Any] | None = None) -> Trainer:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--output-dir", default=os.path.join(os.environ.get("DLSUB_JOB_DIR", "dlsub-run"), "hf"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    training = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=16,
                                 learning_rate=3e-3, save_steps=50, save_total_limit=2, logging_steps=1,
                                 report_to=[], disable_tqdm=True, seed=0)  # the GPU where there is one
    dlsub = DlsubCallback()
    trainer = Trainer(model=model, args=training, train_dataset=Sequences(), callbacks=[*(callbacks or []), dlsub])
    trainer.train(resume_from_checkpoint=dlsub.resume_checkpoint(training.output_dir))
    return trainer


if __name__ == "__main__":
    main()
