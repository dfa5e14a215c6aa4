"""The `verl.plugins` entry point of entropy-rft: registers the V1 trainer "entropy_rft" and the FSDP engine vendor
"entropy_rft" by name, and imports them (entropy_rft.integrations.verl, with verl's V1 trainers and engines) only
when a process chooses one of them.

`import verl` imports every `verl.plugins` entry point in every process (driver, task runner, each Ray worker).
Importing entropy_rft.integrations.verl there would load verl's V1 trainer and engine modules, pandas, datasets,
fastapi, peft, accelerate and hydra (about 1,500 modules), print verl's 'engine is not available' warnings and set
TORCH_CUDA_ARCH_LIST (verl's Megatron engine module does, on import) in every process, for users who never ask for
entropy-rft. This module imports only the standard library, and:

1. puts a finder at the front of sys.meta_path that waits for two of verl's own modules; when verl (or anything)
   imports them, it runs their code as usual and then
   - verl.trainer.ppo.v1.trainer_base: makes its TRAINER_REGISTRY a dict that, asked for the missing name
     "entropy_rft" (verl's `get_trainer_cls(trainer.v1.trainer_mode)`), imports entropy_rft.integrations.verl,
     whose `@register_trainer` adds the trainer, and returns it;
   - verl.workers.engine.base: makes EngineRegistry.get_engine_cls, in a process whose VERL_ENGINE_VENDOR is
     "entropy_rft", import entropy_rft.integrations.verl (whose `EngineRegistry.register` adds the engine)
     before verl's own lookup;
2. changes nothing else: no environment variable, no warning filter, no log line.

verl 0.9.1 has no lazy registration of its own, so both are wrappers of verl's registries; tests/test_verl.py checks
that `import verl` with this entry point loads no module beyond this one and the entropy_rft package, prints
nothing more and changes no environment variable, and that verl's main_ppo path finds the trainer and engine.
`VERL_USE_EXTERNAL_MODULES=entropy_rft.integrations.verl` still imports everything at once, raising on errors.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys

TRAINER_NAME = "entropy_rft"  # trainer.v1.trainer_mode (entropy_rft.integrations.verl.TRAINER_NAME)
ENGINE_VENDOR = "entropy_rft"  # VERL_ENGINE_VENDOR (entropy_rft.integrations.verl.ENGINE_VENDOR)
ADAPTER = "entropy_rft.integrations.verl"
TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"
ENGINE_BASE = "verl.workers.engine.base"


def _load_adapter() -> None:
    importlib.import_module(ADAPTER)


class _TrainerRegistry(dict):
    """verl's TRAINER_REGISTRY (same entries) that imports the adapter when "entropy_rft" is asked for and missing."""

    def __missing__(self, name: str):
        if name != TRAINER_NAME:
            raise KeyError(name)
        _load_adapter()  # its @register_trainer writes into this dict
        return dict.__getitem__(self, name)


def _after_trainer_base(module) -> None:
    if not isinstance(module.TRAINER_REGISTRY, _TrainerRegistry):
        module.TRAINER_REGISTRY = _TrainerRegistry(module.TRAINER_REGISTRY)


def _after_engine_base(module) -> None:
    registry = module.EngineRegistry
    original = registry.__dict__["get_engine_cls"]
    if getattr(original.__func__, "_entropy_rft", False):
        return

    def get_engine_cls(cls, model_type: str, backend: str):
        if os.getenv("VERL_ENGINE_VENDOR") == ENGINE_VENDOR:
            _load_adapter()  # registers EntropyFSDPEngine under the vendor
        return original.__func__(cls, model_type, backend)

    get_engine_cls._entropy_rft = True
    get_engine_cls.__doc__ = original.__func__.__doc__
    registry.get_engine_cls = classmethod(get_engine_cls)


HOOKS = {TRAINER_BASE: _after_trainer_base, ENGINE_BASE: _after_engine_base}


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the hook on the executed module; everything else is the original loader's."""

    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name):  # get_source, get_code, is_package, ... for inspect and linecache
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds HOOKS' modules through the other finders and wraps their loaders; no effect on any other import."""

    def find_spec(self, name, path, target=None):
        hook = HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, hook)
                return spec
        return None


def install() -> None:
    """The finder once per process, and the hooks at once on any of the modules already imported."""
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    for name, hook in HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])


install()
