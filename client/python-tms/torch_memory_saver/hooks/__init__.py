"""The two ways allocations reach gmbd: the preload shim and PyTorch's pluggable allocator."""
