"""Writing `--out` files without harming the user's own: the new content goes to a temporary file in the same
directory and is renamed into place, so a failed write (a full disk) leaves the old file whole; an `--out` that
is one of the command's own inputs is refused; a symbolic link is written through only with --force."""

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.text import SHORT, plain, shorten


def write_output(out: str, write: Callable[[Path], None], inputs: Iterable[str] = (), force: bool = False) -> str:
    """Write `out` through `write(temporary path)` and rename it into place; returns what the CLI says about it
    ("wrote X", "replaced X"). The temporary file's name is short and fixed in length, so that any name the file
    system takes for `out` (up to 255 bytes) can be written; a longer one is refused when it is renamed."""
    path = Path(out).expanduser()
    shown = shorten(plain(out), 3 * SHORT)  # an error line keeps room for its reason
    if os.path.islink(path):  # os.path's tests answer False where the path cannot be examined (too long a name)
        if not force:
            raise KvplanError(f"--out {shown} is a symbolic link: give --force to write to the file it points to")
        path = Path(os.path.realpath(path))
    if os.path.isdir(path):
        raise KvplanError(f"--out {shown} is a directory: name a file")
    existed = os.path.exists(path)
    if existed and not os.path.isfile(path):
        raise KvplanError(f"--out {shown} is not a regular file (a device or a pipe): name a file")
    for name in inputs:
        source = Path(name).expanduser()
        if existed and os.path.exists(source) and os.path.samefile(path, source):
            raise KvplanError(f"--out {shown} is one of this command's inputs: write somewhere else")
    try:
        handle, temporary = tempfile.mkstemp(prefix=".kvplan-", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise KvplanError(f"cannot write {shown}: {err.strerror or err}") from None
    os.close(handle)
    try:
        write(Path(temporary))
        if existed:  # keep the replaced file's permissions
            os.chmod(temporary, path.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except OSError as err:
        raise KvplanError(f"cannot write {shown}: {err.strerror or err} (any file already there is unchanged)") \
            from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return f"{'replaced' if existed else 'wrote'} {plain(path)}"
