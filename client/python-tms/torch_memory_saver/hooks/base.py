"""``HookMode`` and the per-mode helper torch_memory_saver builds on."""

import importlib
from typing import Literal

HookMode = Literal["preload", "torch"]


class HookUtilBase:
    """The library and allocator of one hook mode.

    Each mode's class names itself (``mode = "preload"``) and is entered in
    ``_modes`` when it is defined; importing the ``hooks`` package defines them
    all, so this module needs neither of them by name.
    """

    mode = None
    _modes = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.mode:
            HookUtilBase._modes[cls.mode] = cls

    @staticmethod
    def create(hook_mode):
        importlib.import_module(__package__)
        kinds = HookUtilBase._modes
        if hook_mode not in kinds:
            raise ValueError(f"hook_mode must be one of {tuple(sorted(kinds))}, not {hook_mode!r}")
        return kinds[hook_mode]()

    def get_path_binary(self):
        raise NotImplementedError

    def get_allocator(self):
        return None
