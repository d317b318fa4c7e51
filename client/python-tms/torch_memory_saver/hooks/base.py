"""``HookMode`` and the per-mode helper torch_memory_saver builds on."""

from typing import Literal

HookMode = Literal["preload", "torch"]


class HookUtilBase:
    """The library and allocator of one hook mode."""

    @staticmethod
    def create(hook_mode):
        from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
        from torch_memory_saver.hooks.mode_torch import HookUtilModeTorch

        kinds = {"preload": HookUtilModePreload, "torch": HookUtilModeTorch}
        if hook_mode not in kinds:
            raise ValueError(f"hook_mode must be one of {tuple(kinds)}, not {hook_mode!r}")
        return kinds[hook_mode]()

    def get_path_binary(self):
        raise NotImplementedError

    def get_allocator(self):
        return None
