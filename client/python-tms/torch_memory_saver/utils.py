"""Helpers torch_memory_saver's users and tests import."""

import logging
import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import gmb

logger = logging.getLogger(__name__)

# The libraries that stand in for torch_memory_saver's, by its names for them.
_BINARIES = {
    "torch_memory_saver_hook_mode_preload": gmb.preload_path,
    "torch_memory_saver_hook_mode_torch": gmb.library_path,
}


@lru_cache(maxsize=1)
def is_xpu():
    """Whether torch sees an Intel XPU (gmbd serves CUDA devices only)."""
    try:
        import torch
    except ImportError:
        return False
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def get_binary_path_from_package(stem):
    """The library that serves ``stem``: libgmb_preload.so or libgmb.so."""
    if stem not in _BINARIES:
        raise RuntimeError(f"torch_memory_saver (gmbd): no library for {stem!r}; "
                           f"known: {', '.join(_BINARIES)}")
    return Path(_BINARIES[stem]())


@contextmanager
def change_env(key, value):
    """Set ``key`` to ``value`` in os.environ until exit, then restore (or remove) it."""
    old = os.environ.get(key)
    os.environ[key] = value
    logger.debug("change_env set key=%s value=%s", key, value)
    try:
        yield
    finally:
        assert os.environ[key] == value, f"{key} changed inside change_env"
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
        logger.debug("change_env restore key=%s value=%s", key, old)
