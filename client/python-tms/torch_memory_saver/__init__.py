"""torch_memory_saver's API on gmbd (the stand-in package).

``torch_memory_saver``, ``TorchMemorySaver`` and ``configure_subprocess`` are
gmb.torch_memory_saver's: one singleton, whichever name imports it.
"""

from .entrypoint import TorchMemorySaver, torch_memory_saver
from .hooks.mode_preload import configure_subprocess

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
