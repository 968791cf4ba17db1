"""`python -m emulator ...` == `kvroute emulate ...`."""

from __future__ import annotations

import sys

from emulator.cli import main

sys.exit(main())
