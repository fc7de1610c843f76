"""`python -m ppo_async ...` (see ppo_async.cli)."""

import sys

from ppo_async.runtime.xla_flags import apply_cpu_workarounds

apply_cpu_workarounds()  # entry point: before JAX starts its backend

from ppo_async.cli import main  # noqa: E402

sys.exit(main())
