"""Writing `--out` files without harming the user's own: the new content goes to a temporary file in the same
directory and is renamed into place, so a failed write (a full disk) leaves the old file whole; an `--out` that
is one of the command's own inputs is refused; a symbolic link is written through only with --force."""

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.text import plain


def write_output(out: str, write: Callable[[Path], None], inputs: Iterable[str] = (), force: bool = False) -> str:
    """Write `out` through `write(temporary path)` and rename it into place; returns what the CLI says about it
    ("wrote X", "replaced X")."""
    path = Path(out).expanduser()
    shown = plain(out)
    if path.is_symlink():
        if not force:
            raise KvplanError(f"--out {shown} is a symbolic link: give --force to write to the file it points to")
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise KvplanError(f"--out {shown} is a directory: name a file")
    if path.exists() and not path.is_file():
        raise KvplanError(f"--out {shown} is not a regular file (a device or a pipe): name a file")
    for name in inputs:
        source = Path(name).expanduser()
        if path.exists() and source.exists() and path.samefile(source):
            raise KvplanError(f"--out {shown} is one of this command's inputs: write somewhere else")
    existed = path.exists()
    directory = path.parent
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
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
