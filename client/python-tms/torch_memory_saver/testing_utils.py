"""What torch_memory_saver's own tests import (not for applications)."""

from torch_memory_saver.utils import is_xpu

__all__ = ["get_device", "empty_cache", "get_and_print_gpu_memory", "is_xpu"]


def _torch():
    import torch

    return torch


def get_device():
    """The device string of the tests: always "cuda" here (gmbd serves CUDA devices)."""
    return "xpu" if is_xpu() else "cuda"


def empty_cache():
    _torch().cuda.empty_cache()


def get_and_print_gpu_memory(message, gpu_id=0):
    """The device's used memory as NVML reports it (every process), printed with ``message``."""
    mem = _torch().cuda.device_memory_used(gpu_id)
    print(f"GPU {gpu_id} memory: {mem / 1024 ** 3:.2f} GB ({message})")
    return mem
