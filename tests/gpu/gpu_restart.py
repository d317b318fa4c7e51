#!/usr/bin/env python3
"""gpu_restart.py BUILD_DIR [GIB] - restart without loss on a real GPU.

Plays systemd for gmbd on the cuda backend, the way tests/test_restart.c
does on the host backend: holds the listening socket, keeps what gmbd
stores with FDSTORE=1 (an exported CUDA fd per chunk, and the state memfd),
and starts gmbd again with them in LISTEN_FDS/LISTEN_FDNAMES after killing
it with SIGKILL while tests/gpu/gpu_restart.cu holds memory.

Checks: the new gmbd re-imports the chunks instead of creating memory (its
status is the same as before, and the GPU's used memory does not grow by
the clients' bytes), and the client's bytes and address survive (the
client's own RESULT line). Prints "RESULT: PASS|FAIL - why" last.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from fake_sd import Manager

B = sys.argv[1]
GIB = sys.argv[2] if len(sys.argv) > 2 else "4"
TMP = tempfile.mkdtemp(prefix="gmbgpu.")
SOCK = TMP + "/gmbd.sock"
NOTIFY = TMP + "/notify"
ENV = dict(os.environ, GMB_SOCKET=SOCK)


def fail(why):
    print("RESULT: FAIL - " + why, flush=True)
    sys.exit(1)


def spawn(mgr, listen):
    with mgr.cond:
        items = list(mgr.store.items())
    fds = [listen.fileno()] + [fd for _, fd in items]
    names = ["gmbd.socket"] + [n for n, _ in items]

    def place():  # fds at 3.., as systemd passes them
        high = [os.dup(fd) for fd in fds]
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)

    env = dict(os.environ, NOTIFY_SOCKET=NOTIFY, LISTEN_FDS=str(len(fds)),
               LISTEN_FDNAMES=":".join(names))
    cmd = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", B + "/gmbd", "--backend",
           "cuda", "--socket", SOCK, "--log-level", "info"]
    return subprocess.Popen(cmd, env=env, preexec_fn=place, close_fds=False)


def status():
    out = subprocess.run([B + "/gmbctl", "status", "--json"], env=ENV, capture_output=True,
                         text=True, timeout=30)
    if out.returncode:
        fail("gmbctl status: " + out.stderr)
    return json.loads(out.stdout)


# What the driver reports moves with any process on the GPU (the new gmbd's
# own cuInit among them); the restart check compares what gmbd keeps.
DRIVER_VIEW = ("driver", "outside_bytes")


def kept(st):
    st = json.loads(json.dumps(st))
    for d in st.get("devices", []):
        for k in DRIVER_VIEW:
            d.pop(k, None)
    return st


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits", "-i", "0"], capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[0])


def main():
    mgr = Manager(NOTIFY)
    listen = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listen.bind(SOCK)
    os.chmod(SOCK, 0o666)
    listen.listen(64)
    gmbd = spawn(mgr, listen)
    if not mgr.wait_ready(1):
        fail("gmbd did not say READY=1")
    client = subprocess.Popen([B + "/gpu_restart", GIB], env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    line = client.stdout.readline()
    if not line.startswith("READY"):
        fail("the client did not get ready: " + line)
    before, used_before = status(), gpu_used_mib()
    print("before: %s, GPU used %d MiB" % (before["devices"][0], used_before), flush=True)

    gmbd.send_signal(signal.SIGKILL)
    gmbd.wait()
    if not mgr.sync():
        fail("the notify socket did not drain")
    chunks = [n for n in mgr.store if n.startswith("chunk.")]
    print("gmbd killed; the store holds the state and %d chunk fds" % len(chunks), flush=True)
    t0 = time.monotonic()
    gmbd = spawn(mgr, listen)
    if not mgr.wait_ready(1 + 1):
        fail("gmbd did not say READY=1")
    print("gmbd back in %.3f s" % (time.monotonic() - t0), flush=True)
    after, used_after = status(), gpu_used_mib()
    print("after:  %s, GPU used %d MiB" % (after["devices"][0], used_after), flush=True)
    if kept(after) != kept(before):
        fail("status changed across the restart:\n%s\n%s" % (before, after))
    # A re-created pool would add the clients' bytes (GiB); gmbd's own cuInit is a few MiB.
    if abs(used_after - used_before) > 256:
        fail("GPU memory used went from %d to %d MiB" % (used_before, used_after))

    client.stdin.write("go\n")
    client.stdin.flush()
    out = client.stdout.read()
    print(out, end="", flush=True)
    if client.wait() != 0 or "RESULT: PASS" not in out:
        fail("the client failed")
    gmbd.send_signal(signal.SIGTERM)
    if gmbd.wait() != 0:
        fail("gmbd did not exit cleanly")
    print("RESULT: PASS - the chunks came back from the fd store (same status, GPU memory "
          "%d -> %d MiB) and the client carried on" % (used_before, used_after), flush=True)


if __name__ == "__main__":
    main()
