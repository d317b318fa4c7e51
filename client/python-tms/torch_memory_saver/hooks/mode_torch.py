"""hook_mode="torch": PyTorch's pluggable allocator over libgmb's gmb_torch_malloc/gmb_torch_free."""

from torch_memory_saver.hooks.base import HookUtilBase
from torch_memory_saver.utils import get_binary_path_from_package


class HookUtilModeTorch(HookUtilBase):
    mode = "torch"

    def __init__(self):
        from torch.cuda.memory import CUDAPluggableAllocator

        self.allocator = CUDAPluggableAllocator(self.get_path_binary(), "gmb_torch_malloc",
                                                "gmb_torch_free")

    def get_path_binary(self):
        return str(get_binary_path_from_package("torch_memory_saver_hook_mode_torch"))

    def get_allocator(self):
        return self.allocator.allocator()
