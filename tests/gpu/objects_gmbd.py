"""objects_gmbd.py - gmbd under a stand-in for systemd, for --case restart of
tests/gpu/torch_objects.py, as tests/gpu/gpu_restart.py plays it.

ManagedGmbd starts gmbd with a listening socket it does not own (LISTEN_FDS)
and an fd store (fake_sd.Manager, the NOTIFY_SOCKET end): SIGKILLed and
started again, gmbd gets its chunks' fds back and keeps its memory. It runs in
the driver, which is no gmbd client.
"""

import fcntl
import os
import resource
import signal
import socket
import subprocess
import time

from fake_sd import Manager


class ManagedGmbd:
    """gmbd --backend cuda --pool-keep 0 on its own socket, with a listening socket it
    does not own and an fd store (SIGKILL and start again keeps its memory)."""

    def __init__(self, gmbd, tmp):
        self.gmbd = gmbd
        self.sock_path = os.path.join(tmp, "gmbd.sock")
        self.log_path = os.path.join(tmp, "gmbd.log")
        self.mgr = Manager(os.path.join(tmp, "notify"))
        self.listen = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listen.bind(self.sock_path)
        os.chmod(self.sock_path, 0o666)
        self.listen.listen(64)
        self.proc = None
        self.starts = 0

    def start(self):
        with self.mgr.cond:
            items = list(self.mgr.store.items())
        fds = [self.listen.fileno()] + [fd for _, fd in items]
        names = ["gmbd.socket"] + [n for n, _ in items]

        top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

        def place():
            """fds at 3.., as systemd passes them, and nothing else of ours: the
            driver's CUDA fds must not live on in gmbd. Copied above the targets
            first, so that no dup2 overwrites a source still to be placed."""
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, len(fds) + 16) for fd in fds]
            for i, fd in enumerate(high):
                os.dup2(fd, 3 + i)
            os.closerange(3 + len(fds), top)

        env = dict(os.environ, NOTIFY_SOCKET=self.mgr.path, LISTEN_FDS=str(len(fds)),
                   LISTEN_FDNAMES=":".join(names))
        env.pop("LD_PRELOAD", None)
        cmd = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", self.gmbd, "--backend", "cuda",
               "--socket", self.sock_path, "--pool-keep", "0", "--log-level", "info"]
        logf = open(self.log_path, "a")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, preexec_fn=place, close_fds=False,
                                     stdout=logf, stderr=logf)
        logf.close()
        self.starts += 1
        if not self.mgr.wait_ready(self.starts):
            raise RuntimeError("the managed gmbd did not say READY=1 within 60 s")
        return (time.monotonic() - t0) * 1e3

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        if not self.mgr.sync():
            raise RuntimeError("the notify socket did not drain after gmbd's kill")
        with self.mgr.cond:
            return len([n for n in self.mgr.store if n.startswith("chunk.")])

    def stop(self):
        """SIGTERM; its exit status (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return None

    def close(self):
        self.stop()
        self.listen.close()
        self.mgr.close()

    def log_tail(self, n=30):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""
