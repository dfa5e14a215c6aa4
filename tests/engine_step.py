"""Driving verl's whole training step on the CPU, shared by tests/test_verl.py (verl 0.9.1) and tests/test_trinity.py
(Trinity-RFT 0.6.0 on verl 0.8.0): verl's own TrainingWorker, ActorRolloutRefWorker and FSDP engine classes, built
without Ray or GPUs, and the slow references the tests compare their gradients with.

What is real: every method these objects run (the workers' tqbridge, infer_batch, train_mini_batch, train_batch,
the engine's micro-batching, packing and forward/backward, the losses). What stands in, each named where it is
built: the Ray worker group (one rank called in this process), FSDP's sharding (the engine runs on the unwrapped
module, as verl's own *_on_cpu tests build it), the optimizer (it records each step's gradient and never steps, so
every mini-batch sees the same weights: the oracle of issue 21), the LR scheduler and the MFU counter (both ask
for a GPU), the engine's offload moves (nothing to move on the CPU) and gloo's missing ReduceOp.AVG (SUM / group
size)."""

import types

import torch
import torch.distributed as dist
import verl.utils.torch_functional as verl_F
from verl.single_controller.base.decorator import MAGIC_ATTR
from verl.utils.profiler import DistProfiler
from verl.workers.config import FSDPOptimizerConfig
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

# float32 gradients of the same sums taken in another order (packed micro-batches vs one sequence at a time): each
# entry sums at most a few thousand products (16 rows x ~10 tokens x hidden 128), so the relative error is bounded
# by ~1e3 x eps(float32) = 1e-4; measured 2e-7 to 1.1e-6 (verl 0.9.1), 2e-7 to 4.2e-6 (Trinity on verl 0.8.0). The
# tests' mutations move it by 6e-2 to 2.8.
GRAD_RTOL = 1e-4


def rel_diff(a, b):
    return float((a - b).norm() / b.norm())


def flat_grad(module):
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in module.parameters()])


class RecordingOptimizer:
    """Stands in for the engine's AdamW: records each step's gradient (what the engine computed for one
    mini-batch) and never changes the weights."""

    def __init__(self, module):
        self.module, self.grads = module, []

    def zero_grad(self, set_to_none=True):
        self.module.zero_grad(set_to_none=True)

    def step(self):
        self.grads.append(flat_grad(self.module).clone())


class ConstantLR:
    def step(self):
        pass

    def get_last_lr(self):
        return [0.0]


def all_reduce_with_average(all_reduce, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """gloo has no ReduceOp.AVG (TrainingWorker averages its loss metric with it): AVG as SUM / group size."""
    if op == dist.ReduceOp.AVG:
        all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor /= dist.get_world_size(group)
        return None
    return all_reduce(tensor, op=op, group=group, async_op=async_op)


def fsdp_engine(cls, module, engine_config):
    """An instance of verl's FSDP engine class `cls` on an unwrapped module, with the recording optimizer."""
    eng = object.__new__(cls)
    eng.module, eng.engine_config, eng.rank, eng.mode = module, engine_config, 0, None
    eng.use_ulysses_sp, eng.ulysses_sequence_parallel_size = False, 1
    eng.ulysses_device_mesh, eng.ulysses_parallel_group = None, None
    eng.compute_entropy_from_logits = verl_F.entropy_from_logits
    eng.pad_to_length, eng.pad_to_length_bucket = False, 1024  # verl 0.9 (0.8 has no static padding)
    eng._autocast_dtype, eng.scaler, eng._qat_enabled = torch.float32, None, False
    eng._is_offload_param = eng._is_offload_optimizer = False
    eng.optimizer, eng.lr_scheduler = RecordingOptimizer(module), ConstantLR()
    eng.optimizer_config = FSDPOptimizerConfig(clip_grad=float("inf"))  # no clipping: the raw gradient
    # Offload between the GPU and the CPU: nothing to move here (verl 0.8's `to` ran gc.collect at each call, 1 s)
    eng.to = lambda *args, **kwargs: None
    return eng


def _new_worker(cls):
    """A verl Worker subclass instance without Worker.__init__ (which reads the Ray rank and world size)."""
    worker = object.__new__(cls)
    worker._Worker__dispatch_dp_rank, worker._Worker__collect_dp_rank = {}, {}
    return worker


def training_worker(engine, loss_fn, remove_padding, cls=TrainingWorker):
    """verl's TrainingWorker (or a subclass) around an engine."""
    worker = _new_worker(cls)
    worker._register_dispatch_collect_info(mesh_name="train", dp_rank=0, is_collect=True)
    worker.engine, worker.engine_config = engine, engine.engine_config
    worker.model_config = {"use_remove_padding": remove_padding}
    worker.loss_fn, worker.device_name = loss_fn, "cpu"
    worker.flops_counter = types.SimpleNamespace(estimate_flops=lambda *a, **k: (0.0, 1.0))  # MFU asks for a GPU
    worker.profiler = DistProfiler(rank=0, config=None)
    return worker


def actor_rollout_ref_worker(actor, ref, cls=ActorRolloutRefWorker):
    """verl's ActorRolloutRefWorker (or a subclass) over two TrainingWorkers, as its init_model wires them."""
    worker = _new_worker(cls)
    worker.actor, worker.ref, worker.enable_routing_replay = actor, ref, False
    worker.profiler = DistProfiler(rank=0, config=None)
    worker.set_dispatch_collect(mesh_name="ref", **ref.get_dispatch_collect())
    worker.set_dispatch_collect(mesh_name="actor", **actor.get_dispatch_collect())
    return worker


class Finished:
    """The future verl's RayWorkerGroup returns for a non-blocking method, already done."""

    def __init__(self, value):
        self.value, self.futures = value, []

    def get(self):
        return self.value


class InProcessWorkerGroup:
    """Stands in for verl's RayWorkerGroup of one rank: a call goes straight to the worker's registered method
    (whose tqbridge, given a KVBatchMeta, reads every field stored for its keys plus the meta's extra_info and puts
    the returned tensors back into TransferQueue, as on a Ray worker); a non-blocking method's result comes back
    as a finished future."""

    def __init__(self, worker):
        self.worker, self._dispatch_info = worker, {"actor": [0]}

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        blocking = getattr(method, MAGIC_ATTR, {}).get("blocking", True)

        def call(*args, **kwargs):
            out = method(*args, **kwargs)
            return out if blocking else Finished(out)

        return call


def policy_gradient(policy, sequences, advantages, terms, count):
    """The actor's reference for one mini-batch: autograd of -(1/count) sum over the `terms` tokens of A * ratio,
    ratio = exp(log p - log p.detach()) = 1 (the weights never move, so a PPO clip is inactive), one sequence at a
    time. sequences: (token ids, response length) per row; advantages and terms: [rows, T] padded."""
    policy.zero_grad(set_to_none=True)
    total = 0.0
    for r, (x, n) in enumerate(sequences):
        logp = torch.log_softmax(policy(input_ids=x[None]).logits[0, :-1].float(), -1)
        logp = logp.gather(-1, x[1:, None]).squeeze(-1)[-n:]
        total = total - (advantages[r, :n] * (logp - logp.detach()).exp() * terms[r, :n]).sum()
    (total / count).backward()
    grads = flat_grad(policy)
    policy.zero_grad(set_to_none=True)
    return grads


def value_gradient(critic, sequences, returns, mask):
    """The critic's reference for one mini-batch: autograd of 0.5 (1/n) sum over the mask's n tokens of (V - R)^2
    (verl's clipped value loss at V = old V), V of a response token read at the position before it, as verl does."""
    critic.zero_grad(set_to_none=True)
    total = 0.0
    for r, (x, n) in enumerate(sequences):
        v = critic(input_ids=x[None]).logits[0, :, 0][len(x) - n - 1 : len(x) - 1]
        total = total + 0.5 * ((v - returns[r, :n]) ** 2 * mask[r, :n]).sum()
    (total / mask.sum()).backward()
    grads = flat_grad(critic)
    critic.zero_grad(set_to_none=True)
    return grads
