"""Shared test helpers: fixture loading and small batch builders."""

import json
import os
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
os.environ["HF_HUB_OFFLINE"] = "1"  # no test may reach the hub: every model and dataset here is local


def _share_the_cores() -> None:
    """Under pytest-xdist (`make test`: several worker processes), each worker takes its share of the cores as torch
    threads, and OMP_NUM_THREADS says so to the processes a test starts (a CLI run, a resumed run): a test that
    compares such a process with one run here then compares the same float32 reductions. A thread count the user set
    is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // workers)  # the cores this process may run on, as make's nproc counts them
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The stand-in model is built into a per-session cache, not the user's ~/.cache."""
    os.environ["ENTROPY_RFT_CACHE"] = str(tmp_path_factory.mktemp("entropy-rft-cache"))
    yield


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def f32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def free_port() -> int:
    """A TCP port free on this host now, for a test's process group (tests under make test's workers run side by
    side, so a fixed port could be taken)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_ids(uids: list) -> torch.Tensor:
    """Map string uids to integer group ids in order of first appearance."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(u, len(seen)) for u in uids], dtype=torch.long)


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from seed 0 and ends with torch's thread count as it found it: the thread count decides how
    float32 reductions are split, so a test that left it changed (tests/test_docs.py runs blocks on one thread) would
    move the bits of every later test that compares against a fresh process (the golden test's bit-exact tier, a
    resumed run against an uninterrupted one)."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
