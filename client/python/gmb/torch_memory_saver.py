"""A drop-in for torch_memory_saver's public API, backed by gmbd.

    from torch_memory_saver import torch_memory_saver        # before
    from gmb.torch_memory_saver import torch_memory_saver    # after

Same names, arguments and semantics: the singleton ``torch_memory_saver``
with ``region(tag="default", enable_cpu_backup=False, ...)``,
``cuda_graph(cuda_graph, pool=None, stream=None, capture_error_mode="global",
tag="default", enable_cpu_backup=False)``, ``disable()``, ``pause(tag=None)``,
``resume(tag=None)``, ``hook_mode`` ("preload" | "torch"),
``memory_margin_bytes``, ``get_cpu_backup(tensor)`` and
``configure_subprocess()``. Memory of a region lives in a gmbd tag of the
same name in the process's default client, so ``gmbctl`` sees and can pause
it too. torch is imported on first use, not at import.

Where gmbd differs (also in the README):
  * ``enable_cpu_backup`` is a property of the tag (gmbd mode preserve), not
    of each allocation: a tag used with and without it keeps every
    allocation's bytes (a mode only grows: discard < preserve).
  * Host copies are pinned when the memory is allocated and kept across
    cycles (torch_memory_saver's ``retain_cpu_backup``, always on).
  * ``pause``/``resume`` of a paused/active or unknown tag succeed (no exit);
    a resume that gmbd cannot serve raises ``gmb.GmbError`` naming the holder.
  * ``memory_margin_bytes`` counts gmbd's unlent budget on the device, not
    cudaMemGetInfo's free bytes (memory in gmbd's pool is free to lend).
  * ``enable_disk_backup`` and ``cpu_backup_backend="mmap"`` are not supported.
  * PyTorch's ``expandable_segments:True`` is refused, as by torch_memory_saver.
"""

import ctypes
import logging
import os
from collections import defaultdict
from contextlib import contextmanager

import gmb

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

log = logging.getLogger(__name__)

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")


def _torch():
    import torch  # only the torch parts need it

    return torch


def _mode(enable_cpu_backup):
    return "preserve" if enable_cpu_backup else "discard"


def _check_backup_options(enable_cpu_backup, enable_disk_backup=False, cpu_backup_backend=None):
    if enable_disk_backup:
        raise NotImplementedError("gmb.torch_memory_saver: enable_disk_backup is not supported; "
                                  "use enable_cpu_backup (gmbd's preserve mode)")
    if cpu_backup_backend is not None:
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend != "pinned":
            raise NotImplementedError("gmb.torch_memory_saver: host copies are pinned memory")


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver`` over gmbd's default client."""

    def __init__(self):
        self._hook_mode = "preload"
        self._margin = 0
        self._impl = None

    # Configuration.

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, value):
        if self._impl is not None:
            raise RuntimeError("hook_mode must be set before the first region or pause")
        if value not in _HOOK_MODES:
            raise ValueError(f"hook_mode must be one of {_HOOK_MODES}, not {value!r}")
        self._hook_mode = value

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        self._margin = int(value)
        gmb.set_memory_margin(self._margin)

    @property
    def retain_cpu_backup(self):
        return True  # gmbd keeps host copies across cycles

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        if not value:
            log.info("gmb.torch_memory_saver: host copies are always retained")

    def set_disk_backup_dir(self, path):
        raise NotImplementedError("gmb.torch_memory_saver: disk backup is not supported")

    # Memory.

    @contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False,
               cpu_backup_backend=None):
        """Tensors made inside live in gmbd tag ``tag`` and pause with it."""
        _check_backup_options(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        with self._ensure().region(tag, _mode(enable_cpu_backup)):
            yield

    @contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag=_TAG_DEFAULT, enable_cpu_backup=False, cpu_backup_backend=None):
        """``torch.cuda.graph`` whose private pool (inputs, outputs, intermediates) pauses with ``tag``."""
        _check_backup_options(enable_cpu_backup, False, cpu_backup_backend)
        with self._ensure().cuda_graph(cuda_graph, pool, stream, capture_error_mode, tag,
                                       _mode(enable_cpu_backup)):
            yield

    @contextmanager
    def disable(self):
        """Inside a region: allocations here are ordinary memory again."""
        with self._ensure().disable():
            yield

    def pause(self, tag=None):
        """Give ``tag``'s memory (``None``: all) back to gmbd; addresses stay reserved."""
        self._ensure().pause(tag)

    def resume(self, tag=None):
        """Memory again at the same addresses; preserved tags get their bytes back."""
        self._ensure().resume(tag)

    def get_cpu_backup(self, x, zero_copy=False):
        """The paused host copy of tensor ``x`` as a CPU tensor, or None while it is active."""
        return self._ensure().get_cpu_backup(x, zero_copy)

    def _ensure(self):
        if self._impl is None:
            self._impl = _Impl(self._hook_mode)
        return self._impl


class _Impl:
    def __init__(self, hook_mode):
        torch = _torch()
        if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise RuntimeError("gmb.torch_memory_saver: PyTorch's expandable_segments makes "
                               "device memory with the driver API, which gmbd cannot pause")
        if hook_mode == "preload" and not gmb.preload_active():
            raise RuntimeError(
                "gmb.torch_memory_saver (hook_mode='preload') needs libgmb_preload.so in "
                f"LD_PRELOAD (LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}, pid {os.getpid()}): "
                "start the process under configure_subprocess(), or set hook_mode='torch'")
        self._torch = torch
        self._hook_mode = hook_mode
        self._client = gmb.default_client()
        self._allocator = None
        if hook_mode == "torch":
            from torch.cuda.memory import CUDAPluggableAllocator

            self._allocator = CUDAPluggableAllocator(gmb.library_path(), "gmb_torch_malloc",
                                                     "gmb_torch_free")
        # One pool per (tag, mode, device): the caching allocator must not hand
        # a region's cached blocks to other code, nor others' blocks to a region.
        self._pools = defaultdict(self._new_pool)

    def _new_pool(self):
        torch = self._torch
        if self._allocator is None:
            return torch.cuda.MemPool()
        return torch.cuda.MemPool(allocator=self._allocator.allocator())

    @contextmanager
    def region(self, tag, mode):
        torch = self._torch
        pool = self._pools[(tag, mode, torch.cuda.current_device())]
        with torch.cuda.use_mem_pool(pool):
            with gmb.region(tag, mode):
                yield

    @contextmanager
    def cuda_graph(self, graph, pool, stream, capture_error_mode, tag, mode):
        if self._hook_mode != "preload":
            raise NotImplementedError("gmb.torch_memory_saver: a pausable CUDA graph needs "
                                      "hook_mode='preload' (as in torch_memory_saver)")
        torch = self._torch
        with torch.cuda.graph(graph, pool=pool, stream=stream,
                              capture_error_mode=capture_error_mode):
            # Inside the capture: the graph's private pool calls cudaMalloc here.
            with gmb.region(tag, mode):
                yield

    @contextmanager
    def disable(self):
        torch = self._torch
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            with gmb.region(None):
                yield
        del pool

    def pause(self, tag):
        try:
            self._client.pause(tag)
        except gmb.GmbError as e:
            if e.errno != 2:  # ENOENT: a tag nothing was allocated in is a no-op here
                raise

    def resume(self, tag):
        try:
            self._client.resume(tag)
        except gmb.GmbError as e:
            if e.errno != 2:
                raise

    def get_cpu_backup(self, x, zero_copy):
        torch = self._torch
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        nbytes = x.numel() * x.element_size()
        try:
            host = self._client.host_copy(x.data_ptr(), nbytes)
        except gmb.GmbError as e:
            raise RuntimeError(f"get_cpu_backup: {e.strerror} (enable_cpu_backup=True?)") from e
        if not host:
            return None
        raw = (ctypes.c_uint8 * nbytes).from_address(host)
        ans = torch.frombuffer(raw, dtype=torch.uint8).view(x.dtype).view(x.shape)
        return ans if zero_copy else ans.clone()


torch_memory_saver = TorchMemorySaver()


@contextmanager
def configure_subprocess():
    """Processes started inside get libgmb_preload.so in LD_PRELOAD (and this libgmb)."""
    shim = gmb.preload_path()
    old = os.environ.get("LD_PRELOAD", "")
    old_lib = os.environ.get("GMB_LIB")
    os.environ["LD_PRELOAD"] = f"{shim}:{old}" if old else shim
    os.environ["GMB_LIB"] = gmb.library_path()
    try:
        yield
    finally:
        os.environ["LD_PRELOAD"] = old
        if old_lib is None:
            os.environ.pop("GMB_LIB", None)
        else:
            os.environ["GMB_LIB"] = old_lib
