"""One process of test_trl.py's two-process run (`accelerate launch --multi_gpu --num_processes 2`, CPU processes
over gloo): trains countdown with Clip_B in TRL's own training loop (EntropyGRPOTrainer.train) for a few steps and
saves, for every generation batch, what this process's loss saw (its rows, advantages and keep mask) with the
policy's statistics at that moment."""

import sys
from pathlib import Path

import torch

from entropy_rft.integrations.trl import rollout_of
from entropy_rft.integrations.trl_countdown import countdown_trainer
from entropy_rft.trainer import policy_stats


def main(out_dir: Path, steps: int) -> None:
    from entropy_rft.integrations.trl import EntropyGRPOTrainer

    class Capturing(EntropyGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            with torch.no_grad():
                stats = policy_stats(self.model, rollout_of(out), self.temperature)
            self.captured.append({"out": {k: v.clone() for k, v in out.items() if torch.is_tensor(v)},
                                  "stats": {k: getattr(stats, k) for k in ("logp", "entropy", "s_star", "s_expect")}})
            return out

    trainer = countdown_trainer(out_dir / "trl", method="clip_b", steps=steps, processes=2, cls=Capturing,
                                per_device_train_batch_size=8)
    trainer.captured = []
    trainer.train()
    torch.save(trainer.captured, out_dir / f"rank{trainer.accelerator.process_index}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
