"""A drop-in for torch_memory_saver's public API, backed by gmbd.

    from torch_memory_saver import torch_memory_saver        # with the stand-in package
    from gmb.torch_memory_saver import torch_memory_saver    # or directly

Same names, arguments and semantics: the singleton ``torch_memory_saver``
with ``region(tag="default", enable_cpu_backup=False, enable_disk_backup=False,
cpu_backup_backend=None)``, ``cuda_graph(cuda_graph, pool=None, stream=None,
capture_error_mode="global", tag="default", enable_cpu_backup=False,
cpu_backup_backend=None)``, ``disable()``, ``pause(tag=None)``,
``resume(tag=None)``, ``hook_mode`` ("preload" | "torch"),
``memory_margin_bytes``, ``retain_cpu_backup``, ``set_disk_backup_dir(path)``,
``get_cpu_backup(tensor, zero_copy=False)`` and ``configure_subprocess()``.
Memory of a region lives in a gmbd tag of the same name in the process's
default client, so ``gmbctl`` sees and can pause it too. torch is imported on
first use, not at import.

Each allocation keeps what its region asked for: discard, or a host copy in
pinned memory ("pinned"), in mmap'd memory whose RSS goes back after resume
("mmap"), or in a file under the disk backup folder. ``retain_cpu_backup``
(default False, or $TMS_RETAIN_CPU_BACKUP) keeps host copies after resume for
the next pause. The configuration variables of torch_memory_saver are read by
libgmb itself: $TMS_INIT_ENABLE (under the preload shim, every allocation of
the process is in tag "default" from the first one on),
$TMS_INIT_ENABLE_CPU_BACKUP, $TMS_INIT_ENABLE_DISK_BACKUP,
$TMS_INIT_CPU_BACKUP_BACKEND, $TMS_RETAIN_CPU_BACKUP, $TMS_DISK_BACKUP_DIR;
``tms_config_from_env()`` says what they ask for and refuses a bad value.

The C entry points torch_memory_saver's libraries export (``tms_pause``,
``tms_get_current_tag``, ...) are libgmb's and the preload shim's; the
symbols torch_memory_saver's tests reach through
``torch_memory_saver._impl._binary_wrapper.cdll`` are looked up there, then
in the process (the CUDA runtime's).

Where gmbd differs (also in the README):
  * ``pause``/``resume`` of a paused/active or unknown tag succeed (no exit);
    a resume that gmbd cannot serve raises ``gmb.GmbError`` naming the holder.
  * ``memory_margin_bytes`` counts gmbd's unlent budget on the device, not
    cudaMemGetInfo's free bytes; it can be read back.
  * ``hook_mode`` can be read back.
  * Bad arguments raise ValueError where torch_memory_saver asserts or exits.
  * PyTorch's ``expandable_segments:True`` is refused, as by torch_memory_saver.
  * CUDA only: no ROCm or XPU paths.
"""

import ctypes
import errno
import logging
import os
from collections import defaultdict
from contextlib import contextmanager
from ctypes import POINTER, c_bool, c_char_p, c_int, c_size_t, c_uint8, c_uint64

import gmb
from gmb import _lib

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "BinaryWrapper",
           "tms_config_from_env", "BACKUP_BACKENDS"]

log = logging.getLogger(__name__)

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")

# gmb.h's GMB_BACKUP_*: where a PRESERVE allocation's bytes go while paused.
BACKUP_DEFAULT, BACKUP_PINNED, BACKUP_MMAP, BACKUP_DISK = -1, 0, 1, 2
BACKUP_BACKENDS = {"pinned": BACKUP_PINNED, "mmap": BACKUP_MMAP}
_BACKUP_NAMES = {BACKUP_PINNED: "pinned", BACKUP_MMAP: "mmap", BACKUP_DISK: "disk"}

# torch_memory_saver's truthy spellings of a boolean variable; anything else is false.
_TRUE = ("1", "true", "TRUE", "yes", "YES")

# Functions of libgmb newer than the core API, bound only when present so that
# an older libgmb still serves everything that does not need them.
_OPTIONAL = {
    "gmb_region_begin_ex": (c_int, [c_char_p, c_int, c_int]),
    "gmb_region_current_ex": (c_int, [c_char_p, c_size_t, POINTER(c_int), POINTER(c_int)]),
    "gmb_set_retain_host_copy": (c_int, [c_int]),
    "gmb_get_retain_host_copy": (c_int, []),
    "gmb_set_default_backup": (c_int, [c_int]),
    "gmb_get_default_backup": (c_int, []),
    "gmb_set_disk_dir": (c_int, [c_char_p]),
    "gmb_get_disk_dir": (c_int, [c_char_p, c_size_t]),
    # The peer's getter, which also applies the peer's defaults (retain off).
    "tms_get_retain_cpu_backup": (c_bool, []),
}
_optional = {}

# The peer's C entry points (names and types of its preload/torch libraries).
_TMS_PROTOTYPES = {
    "tms_set_current_tag": (None, [c_char_p]),
    "tms_get_current_tag": (c_char_p, []),
    "tms_set_interesting_region": (None, [c_bool]),
    "tms_get_interesting_region": (c_bool, []),
    "tms_set_enable_cpu_backup": (None, [c_bool]),
    "tms_get_enable_cpu_backup": (c_bool, []),
    "tms_set_cpu_backup_backend": (None, [c_char_p]),
    "tms_get_cpu_backup_backend": (c_char_p, []),
    "tms_set_enable_disk_backup": (None, [c_bool]),
    "tms_get_enable_disk_backup": (c_bool, []),
    "tms_set_disk_backup_dir": (None, [c_char_p]),
    "tms_set_retain_cpu_backup": (None, [c_bool]),
    "tms_get_retain_cpu_backup": (c_bool, []),
    "tms_pause": (c_int, [c_char_p]),
    "tms_resume": (c_int, [c_char_p]),
    "tms_get_cpu_backup_pointer": (POINTER(c_uint8), [POINTER(c_uint8), c_uint64]),
    "set_memory_margin_bytes": (None, [c_uint64]),
}


def _torch():
    import torch  # only the torch parts need it

    return torch


def _b(s):
    return s.encode() if isinstance(s, str) else s


def _missing(name, what):
    return gmb.GmbError(errno.ENOSYS, f"gmb.torch_memory_saver: {what} needs {name}() in libgmb "
                        f"({gmb.library_path() or 'not loaded'}), which this libgmb lacks")


def _opt(name):
    """libgmb's function ``name`` bound with its prototype, or None when this libgmb lacks it."""
    if name not in _optional:
        fn = getattr(_lib.lib(), name, None)
        if fn is not None:
            fn.restype, fn.argtypes = _OPTIONAL[name]
        _optional[name] = fn
    return _optional[name]


def _need(name, what):
    fn = _opt(name)
    if fn is None:
        raise _missing(name, what)
    return fn


def _check(rc, what):
    if rc < 0:
        raise gmb.GmbError(-rc, f"{what}: {gmb.last_error() or os.strerror(-rc)}")
    return rc


# Configuration from the environment.


def _env_bool(env, name):
    return env.get(name) in _TRUE


def tms_config_from_env(env=None):
    """What torch_memory_saver's variables in ``env`` (default os.environ) ask for.

    A dict: ``enable`` (TMS_INIT_ENABLE), ``cpu_backup``
    (TMS_INIT_ENABLE_CPU_BACKUP), ``disk_backup`` (TMS_INIT_ENABLE_DISK_BACKUP),
    ``backend`` (TMS_INIT_CPU_BACKUP_BACKEND, "pinned" when unset or empty),
    ``retain`` (TMS_RETAIN_CPU_BACKUP), ``disk_dir`` (TMS_DISK_BACKUP_DIR,
    "/tmp" when unset). Booleans are true for 1/true/TRUE/yes/YES only, as in
    torch_memory_saver. ValueError for a backend other than pinned or mmap,
    or for both CPU and disk backup.
    """
    env = os.environ if env is None else env
    backend = env.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
    if backend not in BACKUP_BACKENDS:
        raise ValueError(f"TMS_INIT_CPU_BACKUP_BACKEND={backend!r}: want one of "
                         f"{', '.join(BACKUP_BACKENDS)}")
    cfg = {
        "enable": _env_bool(env, "TMS_INIT_ENABLE"),
        "cpu_backup": _env_bool(env, "TMS_INIT_ENABLE_CPU_BACKUP"),
        "disk_backup": _env_bool(env, "TMS_INIT_ENABLE_DISK_BACKUP"),
        "backend": backend,
        "retain": _env_bool(env, "TMS_RETAIN_CPU_BACKUP"),
        "disk_dir": env.get("TMS_DISK_BACKUP_DIR") or "/tmp",
    }
    if cfg["cpu_backup"] and cfg["disk_backup"]:
        raise ValueError("TMS_INIT_ENABLE_CPU_BACKUP and TMS_INIT_ENABLE_DISK_BACKUP are "
                         "mutually exclusive")
    return cfg


def _check_env_supported(cfg, hook_mode):
    """Refuse, with the reason, what the environment asks of a libgmb that cannot do it."""
    if cfg["enable"] and hook_mode == "preload" and _opt("gmb_region_current_ex") is None:
        raise _missing("gmb_region_current_ex", "TMS_INIT_ENABLE (the whole process as one region)")
    if cfg["retain"] is False and _opt("gmb_set_retain_host_copy") is None:
        log.info("gmb.torch_memory_saver: this libgmb keeps every host copy (retain on)")
    if cfg["backend"] != "pinned" and _opt("gmb_set_default_backup") is None:
        raise _missing("gmb_set_default_backup", "TMS_INIT_CPU_BACKUP_BACKEND=mmap")


# Arguments.


def _resolve_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
    """(gmb mode name, GMB_BACKUP_*) for a region's arguments; ValueError when they conflict."""
    if cpu_backup_backend is not None:
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend not in BACKUP_BACKENDS:
            raise ValueError(f"cpu_backup_backend must be one of {tuple(BACKUP_BACKENDS)}, "
                             f"not {cpu_backup_backend!r}")
    if enable_cpu_backup and enable_disk_backup:
        raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
    if enable_disk_backup:
        return "preserve", BACKUP_DISK
    if not enable_cpu_backup:
        return "discard", BACKUP_DEFAULT
    if cpu_backup_backend is None:
        return "preserve", BACKUP_DEFAULT
    return "preserve", BACKUP_BACKENDS[cpu_backup_backend]


def default_backend():
    """The host copy kind of ``region(enable_cpu_backup=True)`` without a backend."""
    fn = _opt("gmb_get_default_backup")
    if fn is None:
        return "pinned"
    return _BACKUP_NAMES.get(fn(), "pinned")


@contextmanager
def _region(tag, mode, backup):
    """gmb.region whose allocations keep ``mode`` and ``backup`` as their own."""
    fn = _opt("gmb_region_begin_ex")
    if fn is None:
        if backup not in (BACKUP_DEFAULT, BACKUP_PINNED) or default_backend() != "pinned":
            raise _missing("gmb_region_begin_ex",
                           f"a {_BACKUP_NAMES.get(backup, 'mmap')} host copy")
        with gmb.region(tag, mode):
            yield
        return
    gmb._check_hook(fn(_b(tag), gmb.MODES[mode], backup))
    try:
        yield
    finally:
        _lib.lib().gmb_region_end()


# The peer's binary wrapper.


class _Symbols:
    """C symbols by name from a list of libraries, bound once (argtypes stick)."""

    def __init__(self, libs):
        self._libs = libs

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        for lib in self._libs:
            try:
                fn = getattr(lib, name)
            except AttributeError:
                continue
            if name in _TMS_PROTOTYPES:
                fn.restype, fn.argtypes = _TMS_PROTOTYPES[name]
            setattr(self, name, fn)
            return fn
        raise AttributeError(f"{name}: not in libgmb ({gmb.library_path()}), the preload shim "
                             "or the process")


class BinaryWrapper:
    """torch_memory_saver's ``BinaryWrapper``: ``cdll`` has its C entry points.

    They are looked up in ``path_binary`` (when given), libgmb, then the
    process's global scope (the preload shim's and the CUDA runtime's).
    """

    def __init__(self, path_binary=None):
        libs = []
        if path_binary:
            libs.append(ctypes.CDLL(str(path_binary)))
        libs += [_lib.lib(), ctypes.CDLL(None)]
        self.cdll = _Symbols(libs)

    def set_config(self, *, tag, interesting_region, enable_cpu_backup, cpu_backup_backend=None,
                   enable_disk_backup=False):
        self.cdll.tms_set_current_tag(_b(tag))
        self.cdll.tms_set_interesting_region(interesting_region)
        self.cdll.tms_set_enable_cpu_backup(enable_cpu_backup)
        if cpu_backup_backend is not None:
            self.cdll.tms_set_cpu_backup_backend(_b(cpu_backup_backend))
        self.cdll.tms_set_enable_disk_backup(enable_disk_backup)


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver`` over gmbd's default client."""

    def __init__(self):
        self._hook_mode = "preload"
        self._margin = 0
        self._impl = None

    # Configuration.

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, value):
        if self._impl is not None:
            raise RuntimeError("hook_mode must be set before the first region or pause")
        if value not in _HOOK_MODES:
            raise ValueError(f"hook_mode must be one of {_HOOK_MODES}, not {value!r}")
        self._hook_mode = value

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        self._margin = int(value)
        gmb.set_memory_margin(self._margin)

    @property
    def retain_cpu_backup(self):
        """Whether host copies outlive resume (reused by the next pause); False by default.

        libgmb's own default keeps them; the entry points of torch_memory_saver
        (tms_*) apply the peer's default, retain off, unless the process chose.
        """
        fn = _opt("tms_get_retain_cpu_backup")
        if fn is None:
            return True  # an older libgmb keeps every host copy
        return bool(fn())

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        fn = _opt("gmb_set_retain_host_copy")
        if fn is None:
            if value:
                return
            raise _missing("gmb_set_retain_host_copy", "retain_cpu_backup = False")
        _check(fn(1 if value else 0), "retain_cpu_backup")

    def set_disk_backup_dir(self, path):
        """The folder of disk backups (created if needed), for the whole process."""
        os.makedirs(path, exist_ok=True)
        _check(_need("gmb_set_disk_dir", "set_disk_backup_dir")(_b(os.fspath(path))),
               "set_disk_backup_dir")

    # Memory.

    @contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False,
               cpu_backup_backend=None):
        """Tensors made inside live in gmbd tag ``tag`` and pause with it."""
        _resolve_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        with self._ensure().region(tag, enable_cpu_backup, enable_disk_backup,
                                   cpu_backup_backend):
            yield

    @contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag=_TAG_DEFAULT, enable_cpu_backup=False, cpu_backup_backend=None):
        """``torch.cuda.graph`` whose private pool (inputs, outputs, intermediates) pauses with ``tag``."""
        _resolve_backup(enable_cpu_backup, False, cpu_backup_backend)
        with self._ensure().cuda_graph(cuda_graph, pool, stream, capture_error_mode, tag,
                                       enable_cpu_backup, cpu_backup_backend):
            yield

    @contextmanager
    def disable(self):
        """Inside a region: allocations here are ordinary memory again."""
        with self._ensure().disable():
            yield

    def pause(self, tag=None):
        """Give ``tag``'s memory (``None``: all) back; addresses stay reserved."""
        self._ensure().pause(tag)

    def resume(self, tag=None):
        """Memory again at the same addresses; backed-up allocations get their bytes back."""
        self._ensure().resume(tag)

    def get_cpu_backup(self, x, zero_copy=False):
        """The host copy of tensor ``x`` as a CPU tensor (paused, or retained), else None."""
        return self._ensure().get_cpu_backup(x, zero_copy)

    def _ensure_initialized(self):
        self._ensure()

    def _ensure(self):
        if self._impl is None:
            self._impl = _Impl(self._hook_mode)
        return self._impl


class _Impl:
    def __init__(self, hook_mode):
        torch = _torch()
        if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise RuntimeError("gmb.torch_memory_saver: PyTorch's expandable_segments makes "
                               "device memory with the driver API, which gmbd cannot pause")
        if hook_mode == "preload" and not gmb.preload_active():
            raise RuntimeError(
                "gmb.torch_memory_saver (hook_mode='preload') needs libgmb_preload.so in "
                f"LD_PRELOAD (LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}, pid {os.getpid()}): "
                "start the process under configure_subprocess(), or set hook_mode='torch'")
        _check_env_supported(tms_config_from_env(), hook_mode)
        # The peer's defaults (retain off) for this process, unless it chose.
        peer = _opt("tms_get_retain_cpu_backup")
        if peer is not None:
            peer()
        self._torch = torch
        self._hook_mode = hook_mode
        self._client = gmb.default_client()
        self._binary_wrapper = BinaryWrapper()
        self._allocator = None
        if hook_mode == "torch":
            from torch.cuda.memory import CUDAPluggableAllocator

            self._allocator = CUDAPluggableAllocator(gmb.library_path(), "gmb_torch_malloc",
                                                     "gmb_torch_free")
        # One pool per region kind and device, keyed as torch_memory_saver keys
        # it: the caching allocator must not hand a region's cached blocks to
        # other code, nor others' blocks (or another backup kind's) to a region.
        self._mem_pools = defaultdict(self._new_pool)

    def _new_pool(self):
        torch = self._torch
        if self._allocator is None:
            return torch.cuda.MemPool()
        return torch.cuda.MemPool(allocator=self._allocator.allocator())

    def _pool_key(self, tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        backend = (cpu_backup_backend or default_backend()) if enable_cpu_backup else ""
        return (tag, enable_cpu_backup, enable_disk_backup, backend,
                self._torch.cuda.current_device())

    @contextmanager
    def region(self, tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        torch = self._torch
        pool = self._mem_pools[self._pool_key(tag, enable_cpu_backup, enable_disk_backup,
                                              cpu_backup_backend)]
        with torch.cuda.use_mem_pool(pool):
            with self._with_region_config(tag, enable_cpu_backup, cpu_backup_backend,
                                          enable_disk_backup):
                yield

    @contextmanager
    def _with_region_config(self, tag, enable_cpu_backup, cpu_backup_backend,
                            enable_disk_backup=False):
        """This thread's allocations go to ``tag`` with that backup until exit (no pool)."""
        mode, backup = _resolve_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        with _region(tag, mode, backup):
            yield

    @contextmanager
    def cuda_graph(self, graph, pool, stream, capture_error_mode, tag, enable_cpu_backup,
                   cpu_backup_backend):
        if self._hook_mode != "preload":
            raise NotImplementedError("gmb.torch_memory_saver: a pausable CUDA graph needs "
                                      "hook_mode='preload' (as in torch_memory_saver)")
        torch = self._torch
        with torch.cuda.graph(graph, pool=pool, stream=stream,
                              capture_error_mode=capture_error_mode):
            # Inside the capture: the graph's private pool calls cudaMalloc here.
            with self._with_region_config(tag, enable_cpu_backup, cpu_backup_backend):
                yield

    @contextmanager
    def disable(self):
        torch = self._torch
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            with gmb.region(None):
                yield
        del pool

    def pause(self, tag):
        try:
            self._client.pause(tag)
        except gmb.GmbError as e:
            if e.errno != errno.ENOENT:  # a tag nothing was allocated in is a no-op here
                raise

    def resume(self, tag):
        try:
            self._client.resume(tag)
        except gmb.GmbError as e:
            if e.errno != errno.ENOENT:
                raise

    def get_cpu_backup(self, x, zero_copy):
        torch = self._torch
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        nbytes = x.numel() * x.element_size()
        try:
            host = self._client.host_copy(x.data_ptr(), nbytes)
        except gmb.GmbError as e:
            raise RuntimeError(f"get_cpu_backup: {e.strerror} (enable_cpu_backup=True?)") from e
        if not host:
            return None
        raw = (ctypes.c_uint8 * nbytes).from_address(host)
        ans = torch.frombuffer(raw, dtype=torch.uint8).view(x.dtype).view(x.shape)
        return ans if zero_copy else ans.clone()


torch_memory_saver = TorchMemorySaver()


@contextmanager
def _configure_subprocess(shim):
    """Children started inside get ``shim`` first in LD_PRELOAD and this process's libgmb."""
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "GMB_LIB")}
    old = saved["LD_PRELOAD"]
    os.environ["LD_PRELOAD"] = f"{shim}:{old}" if old else str(shim)
    os.environ["GMB_LIB"] = gmb.library_path()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def configure_subprocess():
    """Processes started inside get libgmb_preload.so in LD_PRELOAD (and this libgmb)."""
    with _configure_subprocess(gmb.preload_path()):
        yield
