"""`python -m nodewright.agent <mode> <root_mount> <copy_dir> [interrupt_b64]` (see `cli`)."""

from __future__ import annotations

import sys

from nodewright.agent.cli import main

sys.exit(main())
