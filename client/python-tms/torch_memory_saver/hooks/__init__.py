"""The two ways allocations reach gmbd: the preload shim and PyTorch's pluggable allocator."""

# Defining the modes enters them in HookUtilBase._modes.
from torch_memory_saver.hooks import mode_preload, mode_torch  # noqa: F401,E402
