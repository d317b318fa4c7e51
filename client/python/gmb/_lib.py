"""Finding and binding libgmb with ctypes (no build step, no torch).

One libgmb per process: the preload shim, PyTorch's pluggable allocator and
this module must share its default client and its per-thread regions. So a
libgmb already in the process (loaded by libgmb_preload.so or by the
application, found by its soname) wins; otherwise, in order: $GMB_LIB (only
there when set), libgmb.so next to this package, the source tree's
build/libgmb.so, libgmb.so.0 on the system's library path, and the
usual install folders (/usr/local/lib, /usr/lib) when the loader's cache
does not list them yet (no ldconfig since the install).
"""

import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, c_char_p, c_int, c_size_t, c_ssize_t, c_uint,
                    c_uint64, c_void_p)

SONAME = "libgmb.so.0"

# gmb_control_fn: int (*)(void *arg, int op, const char *tag)
CONTROL_FN = CFUNCTYPE(c_int, c_void_p, c_int, c_char_p)

_H = c_void_p
_PROTOTYPES = {
    "gmb_connect": (c_int, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "gmb_connect_flags": (c_int, [c_char_p, c_char_p, c_uint, POINTER(c_void_p)]),
    "gmb_close": (None, [_H]),
    "gmb_malloc": (c_int, [_H, POINTER(c_void_p), c_size_t, c_int, c_char_p]),
    "gmb_malloc_peers": (c_int, [_H, POINTER(c_void_p), c_size_t, c_int, c_char_p, c_uint64]),
    "gmb_free": (c_int, [_H, c_void_p]),
    "gmb_tag_set_mode": (c_int, [_H, c_char_p, c_int]),
    "gmb_pause": (c_int, [_H, c_char_p]),
    "gmb_resume": (c_int, [_H, c_char_p]),
    "gmb_set_control_handler": (c_int, [_H, CONTROL_FN, c_void_p]),
    "gmb_poll": (c_int, [_H, c_int]),
    "gmb_strerror": (c_char_p, [c_int]),
    "gmb_last_error": (c_char_p, [_H]),
    "gmb_client_id": (c_uint64, [_H]),
    "gmb_status_json": (c_int, [_H, POINTER(c_void_p)]),
    "gmb_status_text": (c_int, [_H, POINTER(c_void_p)]),
    "gmb_control": (c_int, [_H, c_char_p, c_int, c_char_p]),
    "gmb_trim": (c_int, [_H, c_int, POINTER(c_uint64), POINTER(c_uint64)]),
    "gmb_region_begin": (c_int, [c_char_p, c_int]),
    "gmb_region_end": (c_int, []),
    "gmb_region_current": (c_int, [c_char_p, c_size_t, POINTER(c_int)]),
    "gmb_region_malloc": (c_int, [_H, POINTER(c_void_p), c_size_t, c_int]),
    "gmb_region_last_error": (c_char_p, []),
    "gmb_default_client": (c_int, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "gmb_owns": (c_int, [_H, c_void_p]),
    "gmb_host_copy": (c_int, [_H, c_void_p, c_size_t, POINTER(c_void_p)]),
    "gmb_set_memory_margin": (None, [c_uint64]),
    "gmb_library_path": (c_char_p, []),
    "gmb_torch_malloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
    "gmb_torch_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
    "gmb_set_wait": (c_int, [_H, ctypes.c_uint32]),
    "gmb_switch": (c_int, [_H, c_char_p, c_char_p, POINTER(c_char_p), c_size_t,
                           POINTER(c_void_p)]),
    "gmb_set_priority": (c_int, [_H, c_char_p, c_int]),
    "gmb_ipc_get_handle": (c_int, [_H, c_void_p, c_char_p]),
    "gmb_ipc_open": (c_int, [_H, c_char_p, c_int, POINTER(c_void_p)]),
    "gmb_ipc_close": (c_int, [_H, c_void_p]),
    "gmb_ipc_grant": (c_int, [_H, c_void_p, ctypes.c_uint32]),
    "gmb_ipc_revoke": (c_int, [_H, c_void_p, ctypes.c_uint32]),
    "gmb_set_ipc_follow": (c_int, [_H, c_int]),
    "gmb_set_ipc_keep": (c_int, [_H, c_int]),
    "gmb_set_pack": (c_int, [_H, c_int]),
    "gmb_object_publish": (c_int, [_H, c_char_p, c_void_p, c_char_p, c_size_t,
                                   POINTER(c_uint64)]),
    "gmb_object_open": (c_int, [_H, c_char_p, c_uint64, POINTER(c_void_p), c_void_p, c_void_p,
                                c_size_t]),
    "gmb_object_close": (c_int, [_H, c_void_p]),
    "gmb_object_drop": (c_int, [_H, c_char_p, c_uint64]),
    "gmb_object_grant": (c_int, [_H, c_char_p, ctypes.c_uint32, c_int]),
    "gmb_object_pause": (c_int, [_H, c_char_p, c_int]),
    "gmb_object_resume": (c_int, [_H, c_char_p]),
}


class ObjectInfo(ctypes.Structure):
    """struct gmb_object_info."""
    _fields_ = [("version", c_uint64), ("size", c_uint64), ("device", c_int),
                ("owner_uid", ctypes.c_uint32), ("meta_len", c_size_t)]

_lock = threading.Lock()
_lib = None
_libc = None


def _candidates():
    env = os.environ.get("GMB_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, "libgmb.so"),
        os.path.join(here, "..", "libgmb.so"),
        os.path.normpath(os.path.join(here, "..", "..", "..", "build", "libgmb.so")),
        SONAME,
        "/usr/local/lib/" + SONAME,
        "/usr/lib/" + SONAME,
        "/usr/lib/x86_64-linux-gnu/" + SONAME,
    ]


def _open():
    try:
        # RTLD_NOLOAD: only the copy already in the process, whatever its path.
        return ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        pass
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise OSError("gmb: cannot load libgmb: install it (make install runs ldconfig) or set "
                  "GMB_LIB to the path of libgmb.so.0. Tried: " + "; ".join(tried))


def _bind(lib):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def lib():
    """The process's libgmb, loaded and bound on first use (thread-safe)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _bind(_open())
    return _lib


def libc():
    """The C library, to free() what libgmb returns malloc'd."""
    global _libc
    if _libc is None:
        c = ctypes.CDLL(None)
        c.free.argtypes = [c_void_p]
        c.free.restype = None
        _libc = c
    return _libc


def process_symbol(name):
    """A function of the process's global scope (e.g. the preloaded shim's), or None."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except AttributeError:
        return None
