"""gmb - Python client of gmbd, the GPU memory broker (pure ctypes over libgmb).

Importable without torch and without a GPU. The native API::

    import gmb
    c = gmb.Client()                       # the process's default client
    with c.region("weights", "preserve"):  # this thread's allocations go to "weights"
        p = c.malloc(64 << 20)             # a raw buffer (or tensors, via the preload
                                           # shim or PyTorch's pluggable allocator)
    c.pause("weights")                     # memory back to gmbd, address kept
    c.resume("weights")                    # same address, same bytes
    c.status()                             # the dict of `gmbctl status --json`
    c.on_control(lambda op, tag: True)     # let `gmbctl pause/resume` act on us

``gmb.torch_memory_saver`` is a drop-in for torch_memory_saver's API.

Regions are per thread and nest; they route the thread's allocations made by
``Client.malloc``, by the preload shim (libgmb_preload.so) and by the
pluggable allocator (``gmb_torch_malloc``). The latter two always use the
process's default client, so ``Client()`` (no ``private=True``) is the one to
pause. Failures raise ``GmbError`` (an ``OSError`` with gmbd's sentence).
"""

import ctypes
import json
import logging
import os
from contextlib import contextmanager
from ctypes import byref, c_char_p, c_int, c_uint64, c_void_p

from . import _lib

__all__ = [
    "Client", "GmbError", "MODES", "MODE_DISCARD", "MODE_ZERO", "MODE_PRESERVE",
    "default_client", "region", "current_region", "set_memory_margin", "last_error",
    "library_path", "preload_active", "preload_path",
]

__version__ = "0.1.0"

MODE_DISCARD, MODE_ZERO, MODE_PRESERVE = 0, 1, 2
PACK_OFF, PACK_HOOKS, PACK_ALL = 0, 1, 2
MODES = {"discard": MODE_DISCARD, "zero": MODE_ZERO, "preserve": MODE_PRESERVE}
_OPS = {"pause": 1, "resume": 2}
_OP_NAMES = {v: k for k, v in _OPS.items()}
_CONNECT_TOOL = 1

log = logging.getLogger("gmb")


class GmbError(OSError):
    """A libgmb call failed: ``errno`` is the code, ``strerror`` gmbd's or libgmb's sentence."""


def _b(s):
    return s.encode() if isinstance(s, str) else s


def _s(b):
    return b.decode(errors="replace") if b else ""


def _mode(mode):
    if isinstance(mode, int) and mode in MODES.values():
        return mode
    if mode in MODES:
        return MODES[mode]
    raise ValueError(f"gmb: unknown mode {mode!r} (want one of {', '.join(MODES)})")


def _raise(rc, why):
    err = -rc
    raise GmbError(err, why or os.strerror(err))


def last_error():
    """Why this thread's last region, allocation-hook or default-client call failed."""
    return _s(_lib.lib().gmb_region_last_error())


def _check_hook(rc):
    if rc < 0:
        _raise(rc, last_error())
    return rc


@contextmanager
def region(tag, mode="discard"):
    """Route this thread's allocations to ``tag`` (``None``: outside gmbd) until exit."""
    _check_hook(_lib.lib().gmb_region_begin(_b(tag), _mode(mode)))
    try:
        yield
    finally:
        _lib.lib().gmb_region_end()


def current_region():
    """``(tag, mode_name)`` in force on this thread, or ``None`` outside any region."""
    buf = ctypes.create_string_buffer(256)
    mode = c_int(0)
    rc = _check_hook(_lib.lib().gmb_region_current(buf, len(buf), byref(mode)))
    if rc == 0:
        return None
    return _s(buf.value), {v: k for k, v in MODES.items()}[mode.value]


def set_memory_margin(nbytes):
    """Refuse region allocations that would leave less than ``nbytes`` of the budget unlent."""
    _lib.lib().gmb_set_memory_margin(int(nbytes))


def library_path():
    """The libgmb.so this process uses (for CUDAPluggableAllocator)."""
    return _s(_lib.lib().gmb_library_path())


def preload_active():
    """Whether libgmb_preload.so is preloaded into this process."""
    return _lib.process_symbol("gmb_preload_version") is not None


def preload_path():
    """libgmb_preload.so: $GMB_PRELOAD_LIB, else next to libgmb.so."""
    env = os.environ.get("GMB_PRELOAD_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(library_path()), "libgmb_preload.so")


class Client:
    """A connection to gmbd.

    ``Client(socket=None, name=None)`` is the process's default client (the
    one the preload shim and the pluggable allocator allocate through),
    connected on first use from ``socket``/``name`` or $GMB_SOCKET and
    $GMB_CLIENT_NAME; later calls return the same connection. With
    ``private=True``, a connection of its own (``close()`` it).
    """

    def __init__(self, socket=None, name=None, *, private=False, tool=False):
        lib = _lib.lib()
        h = c_void_p()
        self._private = private or tool
        self._handler = None
        if self._private:
            rc = lib.gmb_connect_flags(_b(socket), _b(name), _CONNECT_TOOL if tool else 0,
                                       byref(h))
            if rc < 0:
                _raise(rc, _s(lib.gmb_last_error(None)))
        else:
            _check_hook(lib.gmb_default_client(_b(socket), _b(name), byref(h)))
        self._h = h.value

    # Lifetime.

    def close(self):
        """Disconnect a private client (gmbd takes its memory back); no-op for the default one."""
        if self._private and self._h:
            self._lib().gmb_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _lib(self):
        return _lib.lib()

    def _handle(self):
        if not self._h:
            raise GmbError(107, "gmb: this client is closed")
        return self._h

    def _check(self, rc):
        if rc < 0:
            _raise(rc, self.last_error)
        return rc

    @property
    def id(self):
        """gmbd's id for this client."""
        return int(self._lib().gmb_client_id(self._handle()))

    @property
    def last_error(self):
        """gmbd's or libgmb's sentence for this client's last failure."""
        return _s(self._lib().gmb_last_error(self._handle()))

    # Memory.

    def region(self, tag, mode="discard"):
        """``gmb.region``: regions belong to threads, not clients."""
        return region(tag, mode)

    def malloc(self, size, device=0):
        """Allocate ``size`` bytes in the current region's tag (else "default"); the address."""
        p = c_void_p()
        rc = self._lib().gmb_region_malloc(self._handle(), byref(p), int(size), int(device))
        if rc < 0:
            _raise(rc, last_error())
        return p.value

    def malloc_peers(self, size, device=0, peers=(), tag="default"):
        """``gmb_malloc_peers``: ``size`` bytes on ``device`` in ``tag`` that the devices
        in ``peers`` (indexes as for ``device``) may read and write too, after every
        resume as well; the address. Regions do not apply: the tag is given."""
        mask = 0
        for d in peers:
            if not 0 <= int(d) < 64:
                raise ValueError(f"peer device {d}: want 0..63")
            mask |= 1 << int(d)
        p = c_void_p()
        self._check(self._lib().gmb_malloc_peers(self._handle(), byref(p), int(size), int(device),
                                                 _b(tag), c_uint64(mask)))
        return p.value

    def free(self, ptr):
        self._check(self._lib().gmb_free(self._handle(), c_void_p(ptr)))

    def owns(self, ptr):
        """Whether ``ptr`` is the address of one of this client's allocations."""
        return self._lib().gmb_owns(self._handle(), c_void_p(ptr)) == 1

    def host_copy(self, ptr, size):
        """Address of the saved bytes of ``[ptr, ptr+size)`` while its PRESERVE tag is paused, else None."""
        h = c_void_p()
        rc = self._lib().gmb_host_copy(self._handle(), c_void_p(ptr), int(size), byref(h))
        if rc < 0:
            _raise(rc, last_error())
        return h.value

    def set_mode(self, tag, mode):
        self._check(self._lib().gmb_tag_set_mode(self._handle(), _b(tag), _mode(mode)))

    def pause(self, tag=None):
        """Give ``tag``'s memory (``None``: every tag) back to gmbd; drains the device first."""
        self._check(self._lib().gmb_pause(self._handle(), _b(tag)))

    def resume(self, tag=None):
        """Map memory again at the same addresses; GmbError(ENOMEM) names who holds it."""
        self._check(self._lib().gmb_resume(self._handle(), _b(tag)))

    # The node.

    def _string(self, fn):
        out = c_void_p()
        self._check(fn(self._handle(), byref(out)))
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            _lib.libc().free(out)

    def status(self):
        """The node's state: the dict of ``gmbctl status --json``."""
        return json.loads(self._string(self._lib().gmb_status_json))

    def status_text(self):
        """The node's state as ``gmbctl status`` prints it."""
        return self._string(self._lib().gmb_status_text)

    def control(self, target, op, tag=None):
        """What ``gmbctl pause|resume TARGET [TAG]`` does; returns once the target did it."""
        if op not in _OPS:
            raise ValueError(f"gmb: op must be 'pause' or 'resume', not {op!r}")
        self._check(self._lib().gmb_control(self._handle(), _b(str(target)), _OPS[op], _b(tag)))

    def trim(self, device=-1):
        """Release gmbd's free pool chunks to the driver; ``(released, pending)`` bytes."""
        rel, pend = c_uint64(), c_uint64()
        self._check(self._lib().gmb_trim(self._handle(), int(device), byref(rel), byref(pend)))
        return rel.value, pend.value

    # Arbitration.

    def set_wait(self, seconds):
        """Let malloc and resume wait up to ``seconds`` for memory instead of failing.

        For a tool client it is how long the resumes of ``control`` and
        ``switch`` may wait. 0 (the default, or $GMB_WAIT_MS) turns it off.
        """
        ms = int(round(float(seconds) * 1000))
        if ms < 0 or ms > 0xFFFFFFFF:
            raise ValueError(f"gmb: wait of {seconds!r} s is out of range")
        self._check(self._lib().gmb_set_wait(self._handle(), ms))

    # Sharing memory between processes (CUDA IPC; README: "Sharing memory
    # between processes"). The preload shim answers cudaIpc*MemHandle with
    # these; a program may call them itself.

    IPC_HANDLE_SIZE = 64

    def ipc_handle(self, ptr):
        """The 64-byte handle of the gmbd memory at ``ptr`` (one of this client's
        allocations, or an import), as ``bytes``."""
        h = ctypes.create_string_buffer(self.IPC_HANDLE_SIZE)
        self._check(self._lib().gmb_ipc_get_handle(self._handle(), c_void_p(ptr), h))
        return h.raw

    def ipc_open(self, handle, device=-1):
        """Map what ``handle`` names into this process (once per allocation, each
        open counted); the address of the handle's chunk. ``device``: the one to
        give access (-1: the memory's own)."""
        if len(handle) != self.IPC_HANDLE_SIZE:
            raise ValueError(f"gmb: a handle is {self.IPC_HANDLE_SIZE} bytes, not {len(handle)}")
        p = c_void_p()
        self._check(self._lib().gmb_ipc_open(self._handle(), bytes(handle), int(device),
                                             byref(p)))
        return p.value

    def ipc_close(self, ptr):
        """One open of the import holding ``ptr`` fewer; the last unmaps it."""
        self._check(self._lib().gmb_ipc_close(self._handle(), c_void_p(ptr)))

    def ipc_grant(self, ptr, uid):
        """Let processes of ``uid`` open handles of the allocation holding ``ptr``."""
        self._check(self._lib().gmb_ipc_grant(self._handle(), c_void_p(ptr), int(uid)))

    def ipc_revoke(self, ptr, uid):
        """No new opens by ``uid`` of the allocation holding ``ptr``; open ones stay."""
        self._check(self._lib().gmb_ipc_revoke(self._handle(), c_void_p(ptr), int(uid)))

    def set_ipc_follow(self, on):
        """Whether this client's pauses (and those it asks of others) have the
        processes that imported the tag's memory unmap it first, and map it again
        at the same addresses after the resume ($GMB_IPC_FOLLOW=1 at connect)."""
        self._check(self._lib().gmb_set_ipc_follow(self._handle(), 1 if on else 0))

    def set_ipc_keep(self, on):
        """Whether the last close of an import keeps it mapped (idle) for the next
        open of the same handle ($GMB_IPC_KEEP=1 at connect); gmbd asks for it
        back before its owner's pause and once its owner freed it."""
        self._check(self._lib().gmb_set_ipc_keep(self._handle(), 1 if on else 0))

    def set_pack(self, pack):
        """Which allocations of at most 32 MiB share larger ones of their tag:
        PACK_HOOKS (the default: the hooks'), PACK_ALL (malloc's too) or
        PACK_OFF ($GMB_PACK=off|hooks|all at connect; README "Packing")."""
        self._check(self._lib().gmb_set_pack(self._handle(), int(pack)))

    # Named objects (README: "Named objects"): memory that belongs to a name
    # under this uid, not to a process. gmb.objects builds state dicts on them.

    OBJECT_META_MAX = 48 * 1024

    def object_publish(self, name, ptr, meta=b""):
        """The allocation at ``ptr`` (its base, active) becomes the next version of
        ``name``, described by ``meta`` (bytes, at most 48 KiB); the version's
        number. ``ptr`` stays mapped, read-only: ``object_close`` it, never ``free``."""
        meta = bytes(meta)
        v = c_uint64()
        self._check(self._lib().gmb_object_publish(self._handle(), _b(name), c_void_p(ptr),
                                                   meta, len(meta), byref(v)))
        return v.value

    def object_open(self, name, version=0):
        """Map version ``version`` (0: the latest) of ``name`` (or "UID/NAME") read-only:
        ``(ptr, info, meta)`` with info ``{version, size, device, owner_uid}`` and the
        publisher's description as bytes. Opening one version twice maps it once."""
        p = c_void_p()
        info = _lib.ObjectInfo()
        meta = ctypes.create_string_buffer(self.OBJECT_META_MAX)
        self._check(self._lib().gmb_object_open(self._handle(), _b(name), c_uint64(version),
                                                byref(p), ctypes.addressof(info), meta,
                                                len(meta)))
        n = min(int(info.meta_len), len(meta))
        facts = {"version": int(info.version), "size": int(info.size),
                 "device": int(info.device), "owner_uid": int(info.owner_uid)}
        return p.value, facts, meta.raw[:n]

    def object_close(self, ptr):
        """One open of the version mapped at ``ptr`` fewer; the last unmaps it."""
        self._check(self._lib().gmb_object_close(self._handle(), c_void_p(ptr)))

    def object_drop(self, name, version=0):
        """Drop version ``version`` of ``name`` (0: the whole object); open ones stay."""
        self._check(self._lib().gmb_object_drop(self._handle(), _b(name), c_uint64(version)))

    def object_grant(self, name, uid, revoke=False):
        """Let processes of ``uid`` open ``name`` (as "OWNER_UID/NAME"), or no longer."""
        self._check(self._lib().gmb_object_grant(self._handle(), _b(name), int(uid),
                                                 1 if revoke else 0))

    def object_pause(self, name, discard=False):
        """Free ``name``'s GPU memory for a while: every reader unmaps (its pointer
        kept), the bytes go to a host copy at gmbd (``discard``: dropped). Readers that
        do not follow make it fail (EBUSY); an object paused already is left so."""
        self._check(self._lib().gmb_object_pause(self._handle(), _b(name),
                                                 1 if discard else 0))

    def object_resume(self, name):
        """New GPU memory for paused ``name``, its bytes back (zeros after a discard),
        every reader mapped again at the same pointers before this returns."""
        self._check(self._lib().gmb_object_resume(self._handle(), _b(name)))

    def switch(self, frm, to, tags=None):
        """What ``gmbctl switch FROM TO [--tags ...]`` does: the report, one line per step.

        ``frm``/``to`` name a client or a group; ``tags`` (in order) are
        paused on FROM and resumed on TO where each client has them. On
        failure both sides are put back; the GmbError says so and carries
        the report as ``.report``.
        """
        tags = list(tags or [])
        arr = (c_char_p * max(len(tags), 1))(*[_b(t) for t in tags])
        out = c_void_p()
        rc = self._lib().gmb_switch(self._handle(), _b(str(frm)), _b(str(to)),
                                    arr if tags else None, len(tags), byref(out))
        report = ""
        if out.value:
            try:
                report = ctypes.string_at(out.value).decode(errors="replace")
            finally:
                _lib.libc().free(out)
        if rc < 0:
            err = GmbError(-rc, self.last_error or os.strerror(-rc))
            err.report = report
            raise err
        return report

    def set_priority(self, target, priority):
        """What ``gmbctl priority TARGET N`` does (a client or a group)."""
        self._check(self._lib().gmb_set_priority(self._handle(), _b(str(target)), int(priority)))

    # Remote control.

    def on_control(self, fn):
        """Let operators pause/resume this client: ``fn(op, tag)`` decides.

        ``op`` is "pause" or "resume", ``tag`` a name or ``None`` (every tag).
        It runs on libgmb's thread before the library acts; for a pause, the
        application must have stopped using the memory when it returns.
        Returning ``None``/``True`` agrees, ``False`` refuses (ECANCELED), a
        negative int refuses with that errno; an exception refuses too.
        ``fn=None`` removes the handler.
        """
        if fn is None:
            self._check(self._lib().gmb_set_control_handler(self._handle(), _lib.CONTROL_FN(), None))
            self._handler = None
            return

        def trampoline(arg, op, tag):
            try:
                r = fn(_OP_NAMES.get(op, str(op)), _s(tag) or None)
            except Exception:  # noqa: BLE001 - never let ctypes swallow it as "agreed"
                log.exception("gmb: control handler raised; refusing")
                return -125  # ECANCELED
            if r is None or r is True:
                return 0
            if r is False:
                return -125
            return int(r) if int(r) < 0 else 0

        cb = _lib.CONTROL_FN(trampoline)
        self._check(self._lib().gmb_set_control_handler(self._handle(), cb, None))
        self._handler = cb  # the C side keeps only the pointer

    def poll(self, timeout_ms=-1):
        """Wait for the next request from gmbd to be handled; how many were (0: timeout)."""
        return self._check(self._lib().gmb_poll(self._handle(), int(timeout_ms)))


def default_client():
    """The process's default client (connected on first use)."""
    return Client()
