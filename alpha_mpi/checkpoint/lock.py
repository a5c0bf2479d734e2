"""One writer per checkpoint directory: an advisory `fcntl.flock` on `D/.lock`.

The trainer's rank 0 takes the lock before it reads `latest` or writes anything, and holds it
until the run ends (the kernel drops it when the process dies, even by SIGKILL, so a crashed
run never leaves a stale lock). A second trainer on the same directory is refused by name
(`checkpoint-locked`) before it writes. Readers (`checkpoint verify/inspect`) take no lock:
published steps are immutable.

The lock is per process: every Checkpointer of one process on one directory shares it
(reference-counted), so a library that builds several Checkpointers for one learner works.
flock works on local file systems and on NFS (Linux emulates it with POSIX locks); on Lustre it
needs the `flock` mount option, elsewhere check that your shared file system honours it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import threading

from ..refusals import CheckpointRefusal
from .paths import LOCK

_held = {}  # (st_dev, st_ino) -> [fd, count]
_mutex = threading.Lock()
_INFO = re.compile(rb"pid (\d{1,10}) on host ([A-Za-z0-9._-]{1,64})\n")


class DirectoryLock:
    def __init__(self, root: str):
        self.root, self.key = root, None
        path = os.path.join(root, LOCK)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise CheckpointRefusal(
                    "checkpoint-locked", f"{path} is a symbolic link; alpha_mpi's lock file is a regular file"
                )
            raise CheckpointRefusal(
                "checkpoint-write-failed", f"cannot create the lock file {path}: {e.strerror}"
            )
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _mutex:
            if key in _held:
                os.close(fd)
                _held[key][1] += 1
                self.key = key
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _holder(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise CheckpointRefusal(
                        "checkpoint-locked",
                        f"{root} is being written by another trainer ({holder}); two trainers on "
                        "one checkpoint "
                        f"directory would mix their steps",
                        path=root,
                    )
                raise CheckpointRefusal(
                    "checkpoint-locked",
                    f"cannot lock {path}: {e.strerror} (does this file system support flock?)",
                    path=root,
                )
            os.ftruncate(fd, 0)
            os.pwrite(
                fd, f"pid {os.getpid()} on host {socket.gethostname()[:64]}\n".encode("ascii", "replace"), 0
            )
            _held[key] = [fd, 1]
            self.key = key

    def release(self) -> None:
        with _mutex:
            if self.key is None or self.key not in _held:
                return
            entry = _held[self.key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.key]
                os.close(entry[0])  # closing the descriptor drops the flock
            self.key = None

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def _holder(fd) -> str:
    """Who holds the lock, from the lock file, shown only when it has the form alpha_mpi writes."""
    try:
        data = os.pread(fd, 128, 0)
    except OSError:
        return "holder unknown"
    m = _INFO.fullmatch(data)
    return f"pid {m.group(1).decode()} on host {m.group(2).decode()}" if m else "holder unknown"
