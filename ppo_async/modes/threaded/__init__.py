"""Threaded mode (interim step of issue 25 item 2): `threaded.py` moved to `threaded/run.py`
unchanged, so its history follows; this package stands for that module until the next commit
splits it by concern."""

import sys

from ppo_async.modes.threaded import run as _run

sys.modules[__name__] = _run  # `ppo_async.modes.threaded` is the moved module itself (tests patch its names)
