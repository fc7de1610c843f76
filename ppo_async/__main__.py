"""`python -m ppo_async ...` (see ppo_async.cli)."""

import sys

from ppo_async.cli import main

sys.exit(main())
