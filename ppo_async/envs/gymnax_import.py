"""gymnax, imported without the plotting stack its renderers load at import time.

`import gymnax` runs `gymnax/environments/__init__.py`, which imports every env module; two of
them import plotting libraries at module level for their `render` methods only (gymnax 1.0.1:
`misc/pong.py` imports `seaborn` - and with it scipy.stats and pandas - and
`matplotlib.pyplot`; `bsuite/catch.py` and others `matplotlib.pyplot`). That was ~1,000 of
the ~2,050 modules and about 1 s of every run's start on a CartPole env that draws nothing
(`experiments/bench_startup.py`, issue 40 item 12).

`import_gymnax` imports gymnax with a stand-in module for each of those libraries that is not
yet imported. A stand-in imports the real library on its first attribute access and forwards to
it, so a gymnax renderer still works (it pays the import when it draws); the stand-ins are
taken out of `sys.modules` as soon as gymnax is imported, so every later `import seaborn` or
`import matplotlib.pyplot`, by the caller or by this package's plots, gets the real module.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types

# What gymnax's env modules import at module level for rendering alone (gymnax 1.0.1).
RENDER_ONLY_MODULES = ("seaborn", "matplotlib.pyplot")

_import_lock = threading.Lock()


class DeferredModule(types.ModuleType):
    """A stand-in for module `name`: the first non-dunder attribute read imports the real
    module (if nothing has yet) and every read is forwarded to it."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        real = sys.modules.get(self.__name__)
        if real is None or isinstance(real, DeferredModule):
            sys.modules.pop(self.__name__, None)
            real = importlib.import_module(self.__name__)
        return getattr(real, attr)


def import_gymnax() -> types.ModuleType:
    """`import gymnax`, with stand-ins for `RENDER_ONLY_MODULES` not yet imported (see the
    module docstring); returns the gymnax module. Idempotent and thread-safe."""
    with _import_lock:
        if "gymnax" in sys.modules:
            return sys.modules["gymnax"]
        stand_ins = {}
        for name in RENDER_ONLY_MODULES:
            if name not in sys.modules:
                stand_ins[name] = sys.modules[name] = DeferredModule(name)
        try:
            import gymnax
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
    return gymnax
