"""``TorchMemorySaver`` and its singleton, from gmb.torch_memory_saver."""

from typing import Literal

from gmb.torch_memory_saver import _TAG_DEFAULT, TorchMemorySaver, torch_memory_saver

from .utils import is_xpu

CpuBackupBackend = Literal["mmap", "pinned"]

__all__ = ["TorchMemorySaver", "torch_memory_saver", "CpuBackupBackend", "is_xpu", "_TAG_DEFAULT"]
