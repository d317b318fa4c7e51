"""State dicts as named objects: one version holds every tensor of a state dict.

    from gmb import objects
    v = objects.publish_state_dict("llama-7b", model.state_dict())   # a trainer
    sd, h = objects.open_state_dict("llama-7b")                      # any reader
    model.load_state_dict(sd, assign=True)  # tensors view gmbd's read-only memory
    h.close()                               # once nothing uses them any more

The tensors are laid out back to back, each at a multiple of 256 bytes, in
one allocation of the client (tag "object:<name>"), copied in on the GPU and
published with a description: the JSON of {name: [offset, dtype, shape]},
zlib-compressed (at most 48 KiB once compressed). Readers get tensors that
view the version's mapping; a write to them faults on the device.

torch is imported only inside publish_state_dict and open_state_dict: the
layout and the description (layout, encode_description, decode_description,
check_description) are plain Python.
"""

import json
import zlib

ALIGN = 256
META_MAX = 48 * 1024


def layout(sizes, align=ALIGN):
    """``[(name, nbytes), ...]`` in order -> ``({name: offset}, total_bytes)``: each
    tensor at the first multiple of ``align`` past the one before."""
    offsets, at = {}, 0
    for name, nbytes in sizes:
        if name in offsets:
            raise ValueError(f"gmb.objects: tensor {name!r} twice")
        if int(nbytes) < 0:
            raise ValueError(f"gmb.objects: tensor {name!r} of {nbytes} bytes")
        at = (at + align - 1) // align * align
        offsets[name] = at
        at += int(nbytes)
    return offsets, at


def encode_description(desc):
    """``{name: [offset, dtype, shape]}`` -> the bytes published beside the version."""
    blob = zlib.compress(json.dumps(desc, separators=(",", ":")).encode(), 9)
    if len(blob) > META_MAX:
        raise ValueError(f"gmb.objects: the description of {len(desc)} tensors takes "
                         f"{len(blob)} bytes compressed, past {META_MAX}")
    return blob


def decode_description(blob):
    """The bytes of encode_description() -> ``{name: [offset, dtype, shape]}``, checked
    for form (ValueError when it is not one)."""
    try:
        desc = json.loads(zlib.decompress(bytes(blob)).decode())
    except (zlib.error, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"gmb.objects: not a state dict's description ({e})") from None
    if not isinstance(desc, dict):
        raise ValueError("gmb.objects: a description is a JSON object")
    for name, v in desc.items():
        ok = (isinstance(v, list) and len(v) == 3 and _is_count(v[0]) and
              isinstance(v[1], str) and isinstance(v[2], list) and all(map(_is_count, v[2])))
        if not ok:
            raise ValueError(f"gmb.objects: tensor {name!r}: want [offset, dtype, shape], "
                             f"not {v!r}")
    return desc


def check_description(desc, size, itemsize):
    """Every tensor of ``desc`` inside ``size`` bytes; ``itemsize(dtype)`` its element's bytes."""
    for name, (off, dtype, shape) in desc.items():
        n = itemsize(dtype)
        for d in shape:
            n *= d
        if off + n > size:
            raise ValueError(f"gmb.objects: tensor {name!r} ends at {off + n}, past the "
                             f"version's {size} bytes")


def _is_count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _dtype_name(torch, dtype):
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def _dtype(torch, name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"gmb.objects: {name!r} is no dtype of this torch")
    return dt


def _bytes_tensor(torch, ptr, size, device, readonly):
    """A uint8 tensor viewing ``size`` bytes of device memory at ``ptr``.

    ``readonly`` is not passed on: torch.as_tensor refuses a
    __cuda_array_interface__ whose read-only flag is set ("the read only flag
    is not supported, should always be False"), and a version's mapping is
    read-only on the device anyway (a write faults)."""
    del readonly

    class _Mem:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}

    return torch.as_tensor(_Mem(), device=torch.device("cuda", device))


def _client(client):
    if client is not None:
        return client
    from . import Client
    return Client()


def publish_state_dict(name, state_dict, client=None, device=None):
    """Publish ``state_dict``'s tensors as the next version of ``name``; its number.
    ``device``: where the version lives (default: the first CUDA tensor's, else the
    current device)."""
    import torch

    c = _client(client)
    items = list(state_dict.items())
    for k, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gmb.objects: {k!r} is a {type(t).__name__}, not a tensor")
    if device is None:
        cuda = [t.device.index for _, t in items if t.is_cuda]
        device = cuda[0] if cuda and cuda[0] is not None else torch.cuda.current_device()
    offsets, total = layout([(k, t.numel() * t.element_size()) for k, t in items])
    desc = {k: [offsets[k], _dtype_name(torch, t.dtype), list(t.shape)] for k, t in items}
    meta = encode_description(desc)
    ptr = c.malloc_peers(max(total, 1), device, (), tag=f"object:{name}")
    try:
        buf = _bytes_tensor(torch, ptr, max(total, 1), device, False)
        for k, t in items:
            n = t.numel() * t.element_size()
            if n:
                dst = buf[offsets[k]:offsets[k] + n].view(t.dtype).view(t.shape)
                dst.copy_(t.detach(), non_blocking=True)
        torch.cuda.synchronize(device)
        del buf
        return c.object_publish(name, ptr, meta)
    except BaseException:
        # Unpublished, the allocation is still the client's (published, it is not).
        if c.owns(ptr):
            c.free(ptr)
        raise


class StateDictHandle:
    """An open version of a published state dict: ``close()`` (or ``with``) once
    nothing uses its tensors; ``version``, ``info`` (the open's facts)."""

    def __init__(self, client, ptr, info):
        self._client, self._ptr, self.info = client, ptr, info
        self.version = info["version"]

    def close(self):
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            self._client.object_close(ptr)

    @property
    def closed(self):
        return self._ptr is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_state_dict(name, version=0, client=None):
    """Open version ``version`` (0: the latest) of ``name``: ``(state_dict, handle)``,
    the tensors viewing the version's read-only memory on its device."""
    import torch

    c = _client(client)
    ptr, info, meta = c.object_open(name, version)
    h = StateDictHandle(c, ptr, info)
    try:
        desc = decode_description(meta)
        check_description(desc, info["size"],
                          lambda d: torch.empty((), dtype=_dtype(torch, d)).element_size())
        buf = _bytes_tensor(torch, ptr, info["size"], info["device"], True)
        sd = {}
        for k, (off, dtype, shape) in desc.items():
            dt = _dtype(torch, dtype)
            n = torch.empty((), dtype=dt).element_size()
            for d in shape:
                n *= d
            sd[k] = buf[off:off + n].view(dt).view(shape)
        return sd, h
    except BaseException:
        h.close()
        raise
