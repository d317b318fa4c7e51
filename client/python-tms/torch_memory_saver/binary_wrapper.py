"""``BinaryWrapper``: the C entry points (tms_*) of libgmb and the preload shim."""

from gmb.torch_memory_saver import BinaryWrapper

__all__ = ["BinaryWrapper"]
