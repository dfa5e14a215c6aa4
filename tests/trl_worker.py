"""One process of test_trl.py's two-process runs (`accelerate launch --multi_gpu --num_processes 2`, CPU processes
over gloo), in TRL's own training loop on countdown for a few steps.

mode "clip_b": EntropyGRPOTrainer with Clip_B; saves, for every generation batch, what this process's loss saw (its
rows, advantages and keep mask) with the policy's statistics at that moment.
mode "monitor": EntropyGRPOTrainer(method="none"), then a plain GRPOTrainer from the same seed in the same processes;
saves both runs' final weights and logged losses, and the monitor's gathered batch of every generation."""

import sys
from pathlib import Path

import torch

from entropy_rft.integrations.trl import rollout_of
from entropy_rft.integrations.trl_countdown import countdown_trainer
from entropy_rft.train.forward import policy_stats


def main(out_dir: Path, steps: int, mode: str) -> None:
    from entropy_rft.integrations.trl import EntropyGRPOTrainer

    class Capturing(EntropyGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            with torch.no_grad():
                stats = policy_stats(self.model, rollout_of(out), self.temperature)
            every, adv, mask, keep = self._filtered
            self.captured.append(
                {
                    "out": {k: v.clone() for k, v in out.items() if torch.is_tensor(v)},
                    "stats": {k: getattr(stats, k) for k in ("logp", "entropy", "s_star", "s_expect")},
                    "gathered": {"entropy": every.entropy, "s_centered": every.s_centered, "adv": adv, "mask": mask},
                }
            )
            return out

    if mode == "clip_b":
        trainer = countdown_trainer(
            out_dir / "trl", method="clip_b", steps=steps, processes=2, cls=Capturing, per_device_train_batch_size=8
        )
        trainer.captured = []
        trainer.train()
        torch.save(trainer.captured, out_dir / f"rank{trainer.accelerator.process_index}.pt")
        return
    runs = {}
    for name, method, cls in (("monitor", "none", Capturing), ("plain", None, None)):
        trainer = countdown_trainer(
            out_dir / name, method=method, steps=steps, processes=2, cls=cls, per_device_train_batch_size=8
        )
        trainer.captured = []
        trainer.train()
        runs[name] = {
            "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "logs": trainer.state.log_history,
            "captured": trainer.captured,
        }
    torch.save(runs, out_dir / f"monitor{trainer.accelerator.process_index}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "clip_b")
