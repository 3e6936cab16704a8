"""What both shells share on the way to a ``display``/``result`` frame.

Standard library only, Python 3.9+. ``clean`` makes a MIME bundle JSON-ready as
ipykernel's ``json_clean`` does; ``ModuleHooks`` patches modules as they are
imported (the comm bridge's hooks; on the basic shell, which cannot run widgets,
the widgets notice and tqdm's text bar) and serves modules from source (the
basic shell's matplotlib backend).
"""

import binascii
import importlib.machinery
import importlib.util

WIDGETS_NOTICE = (
    "daytona-kernel: interactive widgets need IPython in the sandbox (cells run as plain Python here); "
    "ipywidgets objects will show as static text.\n"
)


def clean(obj):
    """JSON-ready data: bytes become base64 text, as ipykernel's json_clean does (``_repr_png_`` bytes)."""
    if isinstance(obj, bytes):
        return binascii.b2a_base64(obj, newline=False).decode("ascii")
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def tqdm_as_text(module):
    """``tqdm.notebook`` (and so ``tqdm.auto`` in a notebook) draws its text bar where widgets cannot work."""
    import tqdm.std

    module.tqdm = module.tqdm_notebook = tqdm.std.tqdm
    module.trange = module.tnrange = tqdm.std.trange


def tqdm_as_text_without_widgets(module):
    """``tqdm.notebook`` draws a widget when ipywidgets is there (the comm bridge carries it), else its text bar."""
    if importlib.util.find_spec("ipywidgets") is None:
        tqdm_as_text(module)


class _PatchingLoader(object):
    """Wraps a module's loader so a hook can patch the module once it exists."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)


class _SourceLoader(object):
    def __init__(self, source):
        self._source = source

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(self._source, "<%s>" % module.__name__, "exec"), module.__dict__)


class ModuleHooks(object):
    """A meta path finder: ``patches`` {module: function(module)} run once a module is imported;
    ``sources`` {module: source} are modules served from source."""

    def __init__(self, patches, sources=None):
        self.patches = patches
        self.sources = sources or {}

    def find_spec(self, name, path=None, target=None):
        if name in self.sources:
            return importlib.util.spec_from_loader(name, _SourceLoader(self.sources[name]))  # type: ignore[arg-type]  # a duck-typed loader
        after = self.patches.get(name)
        if after is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, after)  # type: ignore[assignment]  # a duck-typed loader
        return spec

    def invalidate_caches(self):
        pass
