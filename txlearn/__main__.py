"""``python -m txlearn ...`` runs the ``txlearn`` command (also under ``torchrun -m txlearn``)."""

import sys

from txlearn.cli import main

sys.exit(main())
