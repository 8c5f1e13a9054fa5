"""On-disk cache of inventories, keyed by the ELF's GNU build-id and the analysis version.

Location: ``$ASYNCRSP_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyncrsp``, else
``~/.cache/asyncrsp``; a ``cache_dir`` argument overrides all three. One
pickle file per binary: ``<build-id>-v<ANALYSIS_VERSION>.pickle``. Bump
``ANALYSIS_VERSION`` whenever the analysis or the model changes what it
produces. A cache that cannot be read or written is ignored silently: the
cache only makes things faster.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path

from .model import Inventory

ANALYSIS_VERSION = 18  # 18: both of 17's; 17: an async-task run's F type collected, the units of Stream::poll_next read / TypeInfo.align (DW_AT_alignment: a tokio task cell's); 16: Stream::poll_next in future_polls, PhantomData<T>'s T collected (a Vec's elements); 15: both of 14's; 14: AArch64 exits (RET group, aarch64 PLT), self in x0, R_AARCH64_RELATIVE / fd_offsets of an awaited leaf's pointer fields (io::util futures); 13: wrapper polls with the coroutine inlined (ResumeFn.wrapper); 12: a pointer field's or local's size is the address size, not its pointee's; 11: future_obj_drops (LocalPool); 10: future_polls (dyn futures), Future::poll units, types 16 hops deep; 3: Poll<T> pending facts (trace); 4: Inventory.types, 5: task_polls/vtables (reflection); 7: async-task runs, plumbing types add no depth; 8: units of task functions read
# 6: fd_offsets (reflection: an I/O readiness wait's fd)
_SAFE = re.compile(r"^[0-9a-fA-F]{2,128}$")


def default_dir() -> Path:
    if os.environ.get("ASYNCRSP_CACHE_DIR"):
        return Path(os.environ["ASYNCRSP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asyncrsp"


def cache_path(build_id: str, cache_dir: Path | None = None, kind: str = "") -> Path | None:
    """The inventory's file, or (``kind``) a companion file of facts derived from the same
    binary and inventory (``proxy.reflect.framecache``: ``<build-id>-v<N>-frames<M>.pickle``)."""
    if not _SAFE.match(build_id):
        return None
    return (cache_dir or default_dir()) / f"{build_id}-v{ANALYSIS_VERSION}{kind}.pickle"


def load_pickle(p: Path | None) -> object | None:
    """Any cached object, or None (missing, unreadable, written by another model)."""
    if p is None:
        return None
    try:  # is_file() inside: a cache directory this user may not enter raises PermissionError
        if not p.is_file():  # (HOME left at another user's: setpriv, sudo -u without -H)
            return None
        with p.open("rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError,
            IndexError):
        return None


def store_pickle(obj: object, p: Path | None) -> Path | None:
    if p is None:
        return None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, p)  # atomic: a concurrent reader sees the old file or the new one
        return p
    except OSError:
        return None


def load(build_id: str, cache_dir: Path | None = None) -> Inventory | None:
    inv = load_pickle(cache_path(build_id, cache_dir))
    if not isinstance(inv, Inventory) or inv.build_id != build_id:
        return None
    if any(not hasattr(inv, f) for f in Inventory.__dataclass_fields__):
        return None  # written by a build of the analysis with another model at this version
    return inv


def store(inv: Inventory, cache_dir: Path | None = None) -> Path | None:
    if inv.build_id is None:
        return None
    return store_pickle(inv, cache_path(inv.build_id, cache_dir))
