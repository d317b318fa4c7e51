"""hook_mode="preload": libgmb_preload.so in LD_PRELOAD routes cudaMalloc to gmbd."""

import os
from contextlib import contextmanager

import gmb
from gmb.torch_memory_saver import _configure_subprocess
from torch_memory_saver.hooks.base import HookUtilBase
from torch_memory_saver.utils import get_binary_path_from_package


class HookUtilModePreload(HookUtilBase):
    mode = "preload"

    def get_path_binary(self):
        if not gmb.preload_active():
            raise RuntimeError(
                "torch_memory_saver (gmbd) observes no libgmb_preload.so in this process "
                f"(LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}, pid {os.getpid()}): use "
                "configure_subprocess() or start it with LD_PRELOAD=/path/to/libgmb_preload.so")
        return gmb.preload_path()


@contextmanager
def configure_subprocess():
    """Processes started inside get libgmb_preload.so first in LD_PRELOAD (only hook_mode=preload needs it)."""
    with _configure_subprocess(get_binary_path_from_package("torch_memory_saver_hook_mode_preload")):
        yield
