"""A stand-in for systemd's side of sd_notify, for the GPU scripts that
restart gmbd without losing memory (gpu_restart.py, objects_gmbd.py for
torch_objects.py): READY=1 counted, the fd store kept (FDSTORE=1, FDNAME=,
FDSTOREREMOVE=1), SYNC=1 answered in order."""

import array
import os
import socket
import threading


class Manager:
    """The fd store and READY=1 from gmbd's notify datagrams (gpu_restart.py's)."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.store = {}
        self.ready = 0
        self.syncs = 0
        self.cond = threading.Condition()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        while True:
            try:
                msg, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
            except OSError:
                return
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            lines = msg.decode(errors="replace").split("\n")
            name = next((ln[7:] for ln in lines if ln.startswith("FDNAME=")), "stored")
            with self.cond:
                for fd in fds:
                    if "FDSTORE=1" in lines:
                        if name in self.store:
                            os.close(self.store[name])
                        self.store[name] = fd
                    else:
                        os.close(fd)
                if "FDSTOREREMOVE=1" in lines and name in self.store:
                    os.close(self.store.pop(name))
                self.ready += "READY=1" in lines
                self.syncs += "SYNC=1" in lines
                self.cond.notify_all()

    def wait_ready(self, n, timeout=60):
        with self.cond:
            return self.cond.wait_for(lambda: self.ready >= n, timeout)

    def sync(self):
        """Datagrams are read in order: once our ping is read, gmbd's are."""
        with self.cond:
            n = self.syncs
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.sendto(b"SYNC=1", self.path)
        s.close()
        with self.cond:
            return self.cond.wait_for(lambda: self.syncs > n, 10)

    def close(self):
        with self.cond:
            for fd in self.store.values():
                os.close(fd)
            self.store.clear()
        self.sock.close()
