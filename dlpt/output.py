"""Writing files the one way dlpt writes them: to a temporary file in the target directory,
then renamed into place, so that a crash or a `kill -9` never leaves half a file behind.

The store writes profiles with `make_temp`; commands and the TUI write text (reports,
exports, diffs) with `write_output`. Both name their temporary files the same way, so
`remove_temp_files` recognises every file a dead dlpt process left, whichever wrote it."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import tempfile
import zlib
from collections.abc import Callable
from typing import Any, TextIO

from dlpt.errors import DlptError

# Temporary files are named `.dlpt-<pid>-<host>-<random>.tmp` so that users recognise them and a
# later save can tell one left by a process that died (kill -9, power loss) from one that a live
# process is writing: only those of this host whose process is gone are removed.
_TEMP = re.compile(r"^\.dlpt-(\d+)-([0-9a-f]{8})-[A-Za-z0-9_]+\.tmp$")


def _host_tag() -> str:
    import socket  # here: only a save asks, and `dlpt report` on a trace would import it for nothing

    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def make_temp(directory: str) -> tuple[int, str]:
    """A new private (0600) temporary file in `directory`: (open descriptor, path)."""
    return tempfile.mkstemp(prefix=f".dlpt-{os.getpid()}-{_host_tag()}-", suffix=".tmp", dir=directory)


def remove_temp_files(directory: str, pid: int | None = None) -> list[str]:
    """Remove the temporary files of dead dlpt processes (or of `pid`) in `directory`."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _host_tag()
    for name in names:
        m = _TEMP.match(name)
        if not m or m.group(2) != host:
            continue
        owner = int(m.group(1))
        if pid is not None:
            if owner != pid:
                continue
        elif owner == os.getpid() or _alive(owner):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def new_file_mode() -> int:
    """The mode `open(path, "w")` would give a new file: 0666 less the umask (0644 under 022).
    Atomic writers start from mkstemp's private 0600 and set this before the rename."""
    return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask would, for a moment, for all threads)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_path(path: str) -> None:
    """Flush a file (or a directory: a rename survives a crash only once it is on disk)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.EROFS):  # not syncable here: fine
            raise
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_output(path: str | None, write: Callable[[TextIO], object]) -> None:
    """Write text to `path` atomically (temporary file, then rename), or to stdout for None or '-'."""
    if path in (None, "-"):
        write(sys.stdout)
        sys.stdout.flush()
        return
    if os.path.exists(path) and not os.path.isfile(path):
        if os.path.isdir(path):
            raise DlptError(f"{path} is a directory; give a file name for the output")
        # A device or a pipe (/dev/null, /dev/stdout, a FIFO): write into it. Renaming a
        # temporary file over it would replace the device node itself.
        try:
            with open(path, "w", encoding="utf-8") as f:
                write(f)
        except OSError as e:
            raise DlptError(f"cannot write {path}: {e.strerror or e}") from None
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise DlptError(f"{directory}: no such directory for {path}")
    try:
        fd, tmp = make_temp(directory)
    except OSError as e:
        raise DlptError(f"cannot write in {directory}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), new_file_mode())  # mkstemp's 0600 would make every output private
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        unlink_quietly(tmp)
        raise DlptError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        unlink_quietly(tmp)
        raise


def write_json(out: TextIO, doc: Any, compact: bool = False) -> None:
    """The one way dlpt writes a JSON document: UTF-8 text as is, one space of indent (compact:
    no whitespace, for formats that repeat every key at every node), and a final newline."""
    if compact:
        json.dump(doc, out, ensure_ascii=False, separators=(",", ":"))
    else:
        json.dump(doc, out, indent=1, ensure_ascii=False)
    out.write("\n")
