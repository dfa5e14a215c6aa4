"""One process of test_trl.py's two-process run (launched with torch.distributed.run): trains two steps with
EntropyGRPOTrainer and saves its first generation batch, as the loss saw it, with the policy's statistics."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_trl import build  # noqa: E402

out_dir = Path(sys.argv[1])
trainer = build(out_dir)
trainer.train()
out, stats = trainer.captured[0]
torch.save({"out": {k: v for k, v in out.items() if torch.is_tensor(v)},
            "stats": {k: getattr(stats, k) for k in ("logp", "entropy", "s_star", "s_expect")}},
           out_dir / f"rank{trainer.accelerator.process_index}.pt")
