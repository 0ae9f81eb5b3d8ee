"""`python -m nodewright` runs the `nodewright` command."""

import sys

from nodewright.cli.main import main

sys.exit(main())
