"""driver_ipc.py - the driver's CUDA IPC calls on gmbd memory, on the GPU.

Code that calls the driver rather than the runtime (vLLM's custom
all-reduce links libcuda; UCX's legacy path) reaches cuIpcGetMemHandle,
cuIpcOpenMemHandle_v2 and cuIpcCloseMemHandle through the process's global
scope, where the preload shim comes first, or looks them up at run time
(cudaGetDriverEntryPoint, cuGetProcAddress). This checks both on a 64 MiB
tensor in gmbd memory (the sender's whole memory one tag, GMB_DEFAULT_TAG):

  - the sender's cuIpcGetMemHandle (global scope) gives gmbd's handle, the
    same bytes as cudaIpcGetMemHandle of the same pointer;
  - a child opens it with cuIpcOpenMemHandle_v2 (global scope), reads every
    byte with cuMemcpyDtoH, closes it with the function the runtime's
    cudaGetDriverEntryPoint returns for "cuIpcCloseMemHandle";
  - gmbd lists the import while open and none after.

Run under LD_PRELOAD=libgmb_preload.so with GMB_SOCKET and
GMB_DEFAULT_TAG=drv (torch_run.sh does). Prints "RESULT: PASS|FAIL - detail".
"""

import ctypes
import hashlib
import os
import subprocess
import sys

import torch

import gmb
from torch_common import MiB, log, result

N = 64 * MiB


class HANDLE(ctypes.Structure):
    """CUipcMemHandle / cudaIpcMemHandle_t: 64 bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


def glob():
    """The global scope: the shim first, as for a program linked with -lcuda."""
    return ctypes.CDLL(None)


def child(hexh, digest):
    """Opens the handle through the driver, checks the bytes, closes."""
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    g = glob()
    h = HANDLE.from_buffer_copy(bytes.fromhex(hexh))
    g.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), HANDLE, ctypes.c_uint]
    ptr = ctypes.c_uint64(0)
    r = g.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, ctypes.c_uint(1))
    if r != 0:
        print(f"open {r}", flush=True)
        return 1
    buf = (ctypes.c_char * N)()
    cuda = ctypes.CDLL("libcuda.so.1")
    r = cuda.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr.value), ctypes.c_size_t(N))
    same = r == 0 and hashlib.sha256(bytes(buf)).hexdigest() == digest
    pid = os.getpid()
    listed = any(m.get("importer_pid") == pid for m in
                 gmb.default_client().status().get("imports", []))
    # The runtime's entry point lookup: the shim's close for gmbd memory.
    fn = ctypes.c_void_p(0)
    st = ctypes.c_int(-1)
    rt = ctypes.CDLL(None).cudaGetDriverEntryPoint
    rt.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_ulonglong,
                   ctypes.POINTER(ctypes.c_int)]
    lr = rt(b"cuIpcCloseMemHandle", ctypes.byref(fn), ctypes.c_ulonglong(0), ctypes.byref(st))
    close = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)(fn.value) if fn.value else None
    cr = close(ptr.value) if close else -1
    print(f"opened same={same} listed={listed} lookup={lr}/{st.value} close={cr}", flush=True)
    return 0 if same and listed and lr == 0 and cr == 0 else 1


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[3]))
    if not gmb.preload_active() or not os.environ.get("GMB_DEFAULT_TAG"):
        result(False, "needs LD_PRELOAD=libgmb_preload.so and GMB_DEFAULT_TAG")
    client = gmb.default_client()
    t = torch.randint(0, 255, (N,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    if not client.owns(t.data_ptr()):
        result(False, "the tensor is not gmbd memory")
    digest = hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()
    g = glob()
    hd, hr = HANDLE(), HANDLE()
    r1 = g.cuIpcGetMemHandle(ctypes.byref(hd), ctypes.c_uint64(t.data_ptr()))
    r2 = g.cudaIpcGetMemHandle(ctypes.byref(hr), ctypes.c_void_p(t.data_ptr()))
    same_bytes = r1 == 0 and r2 == 0 and bytes(hd) == bytes(hr) and bytes(hd)[:6] == b"GMBIPC"
    env = dict(os.environ, GMB_CLIENT_NAME="driver-ipc-child")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", bytes(hd).hex(),
                          digest], env=env, capture_output=True, text=True, timeout=120)
    log(out.stdout.strip(), out.stderr.strip()[-2000:])
    left = client.status().get("imports", [])
    ok = same_bytes and out.returncode == 0 and not left
    result(ok, f"driver cuIpcGetMemHandle on gmbd memory: {r1}, the runtime's bytes: "
               f"{same_bytes}; child via cuIpcOpenMemHandle_v2 / cuMemcpyDtoH / the runtime's "
               f"entry point for cuIpcCloseMemHandle: {out.stdout.strip()}; none left: "
               f"{not left}")


if __name__ == "__main__":
    main()
