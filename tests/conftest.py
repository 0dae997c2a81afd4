import hashlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed(request) -> int:
    """A seed derived from the test id, so every case draws its own inputs reproducibly."""
    value = int(hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8], 16)
    import torch

    torch.manual_seed(value)
    return value


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    """One build cache for the CPU tests, so each variant is compiled once per session."""
    path = tmp_path_factory.mktemp("tkaot-cache")
    os.environ["TKAOT_CACHE_DIR"] = str(path)
    return path


@pytest.fixture
def fake_cuda(monkeypatch):
    """Treat meta tensors as CUDA tensors on device 0, so validation runs without a GPU.

    Every op module's `check_cuda` (imported from tkaot._validate) is replaced; a tensor on
    any other device is still refused the way the real check refuses it.
    """
    import importlib

    import torch

    def check_cuda(op, name, t, device_index=None):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "meta":
            raise ValueError(f"{op}: {name} must be a CUDA tensor, got a tensor on {t.device}")
        return 0

    monkeypatch.setattr("tkaot._validate.check_cuda", check_cuda)
    # ops checked by a declared Signature read get_device() themselves: a meta tensor reads as device 0
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    ops = (
        "tkaot._quant.cast_common", "tkaot._quant.casts", "tkaot._quant.weight_casts", "tkaot._quant.swiglu",
        "tkaot._quant.norm_cast", "tkaot._moe.ops", "tkaot._transform.rotary",
    )  # fmt: skip
    for name in ops:
        module = importlib.import_module(name)
        if hasattr(module, "check_cuda"):
            monkeypatch.setattr(module, "check_cuda", check_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def registry(monkeypatch):
    """A fresh registry that believes device 0 is an sm90 GPU, with no source-checkout set."""
    from tkaot import registry as reg

    r = reg.Registry()
    monkeypatch.setattr(reg, "SOURCE_PREBUILT", Path("/nonexistent"))
    monkeypatch.setattr(r, "device_arch", lambda index: "sm90")
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    return r
