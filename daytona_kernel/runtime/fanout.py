"""``%%daytona map``'s part in the sandbox: scatter, the engine's prelude, gather.

Values travel between the main sandbox and the engines as pickles (cloudpickle
when the sandbox has it, else pickle) written to files, which the kernel moves
with the files API without ever unpickling them. Each function is called with the
context's ``Runtime`` by a typed call (``calls.Scatter``, ``Prelude``, ``Dump``,
``Gather``) that ``Runtime.call`` decodes. Paths are relative to the working directory (the kernel
puts them under ``.daytona-kernel/``, which neither the mirror nor the volume's copy takes). Standard
library only, Python 3.9+.
"""

import os
import pickle as _pickle  # the envelope; cloudpickle's output loads with plain pickle
from typing import Any, Dict, List, Tuple

try:  # inside the sandbox the bootstrap installed these modules under these names
    import _daytona_kernel_files as _files
    import _daytona_kernel_framing as _framing
except ImportError:  # imported from the package (tests)
    from daytona_kernel.runtime import files as _files
    from daytona_kernel.runtime import framing as _framing

Kind = _framing.Kind


def bounds(length: int, world: int) -> List[Tuple[int, int]]:
    """The ``(start, stop)`` of each rank's chunk of a sequence: contiguous, in rank order, as even as
    possible (the first ``length % world`` ranks get one item more), as ipyparallel's scatter does."""
    base, extra = divmod(length, world)
    out: List[Tuple[int, int]] = []
    start = 0
    for rank in range(world):
        stop = start + base + (1 if rank < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _problem(what: str, name: str, exc: Exception) -> str:
    return "%s %r: %s: %s" % (what, name, type(exc).__name__, exc)


def _write(path: str, blob: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(path + ".tmp", path)


def scatter(rt: Any, names: List[str], paths: List[str]) -> None:
    """Split each named sequence of the namespace into ``len(paths)`` chunks and pickle rank R's
    chunks, as ``{name: chunk}``, to ``paths[R]``. The reply says what went, or what is wrong."""
    with rt.request_output():
        rt.send(Kind.REPLY, _scatter(rt.user_ns, names, [os.path.join(rt.workdir, p) for p in paths]))


def _scatter(user_ns: Dict[str, Any], names: List[str], paths: List[str]) -> Dict[str, Any]:
    pickler_name, pickler = _files._pickler()
    parts: List[Dict[str, bytes]] = [{} for _ in paths]
    for name in names:
        if name not in user_ns:
            return {"error": "--scatter %s: there is no variable %r in the notebook's namespace" % (name, name)}
        value = user_ns[name]
        try:
            chunks = [value[start:stop] for start, stop in bounds(len(value), len(paths))]
        except Exception as exc:
            return {
                "error": "--scatter %s: %r cannot be split into chunks (%s: %s); give a list, tuple, range, "
                "array or DataFrame" % (name, name, type(exc).__name__, exc)
            }
        try:
            for part, chunk in zip(parts, chunks):
                part[name] = pickler.dumps(chunk)
        except Exception as exc:
            return {"error": _problem("--scatter could not pickle", name, exc)}
    sizes: List[int] = []
    for path, part in zip(paths, parts):
        blob = _pickle.dumps(part)
        _write(path, blob)
        sizes.append(len(blob))
    return {"bytes": sizes, "pickler": pickler_name}


def prelude(rt: Any, rank: int, world: int, path: str) -> None:
    """Before an engine's cell: define ``rank`` and ``world``, and load its scattered chunks
    (``path``, removed once read; "" for none). Raises if they cannot be loaded."""
    rt.user_ns["rank"], rt.user_ns["world"] = rank, world
    if not path:
        return
    path = os.path.join(rt.workdir, path)
    with open(path, "rb") as f:
        blobs = _pickle.loads(f.read())
    os.remove(path)
    rt.user_ns.update({name: _pickle.loads(blob) for name, blob in blobs.items()})


def dump(rt: Any, names: List[str], path: str) -> None:
    """After an engine's cell: pickle ``{name: value}`` of the gathered names to ``path``."""
    with rt.request_output():
        rt.send(Kind.REPLY, _dump(rt.user_ns, names, os.path.join(rt.workdir, path)))


def _dump(user_ns: Dict[str, Any], names: List[str], path: str) -> Dict[str, Any]:
    _, pickler = _files._pickler()
    blobs: Dict[str, bytes] = {}
    for name in names:
        if name not in user_ns:
            return {"error": "--gather %s: the engine has no variable %r" % (name, name)}
        try:
            blobs[name] = pickler.dumps(user_ns[name])
        except Exception as exc:
            return {"error": _problem("--gather could not pickle", name, exc)}
    blob = _pickle.dumps(blobs)
    _write(path, blob)
    return {"bytes": len(blob)}


def gather(rt: Any, names: List[str], paths: List[str]) -> None:
    """In the main sandbox: set each name to the list of the engines' values, in rank order
    (``paths[R]`` holds rank R's ``{name: value}``; the files are removed)."""
    with rt.request_output():
        rt.send(Kind.REPLY, _gather(rt.user_ns, names, [os.path.join(rt.workdir, p) for p in paths]))


def _gather(user_ns: Dict[str, Any], names: List[str], paths: List[str]) -> Dict[str, Any]:
    per_rank: List[Dict[str, Any]] = []
    try:
        for path in paths:
            with open(path, "rb") as f:
                blobs = _pickle.loads(f.read())
            per_rank.append({name: _pickle.loads(blobs[name]) for name in names})
    except Exception as exc:
        return {"error": "--gather could not load an engine's values here: %s: %s" % (type(exc).__name__, exc)}
    finally:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
    for name in names:
        user_ns[name] = [values[name] for values in per_rank]
    return {"gathered": list(names)}
