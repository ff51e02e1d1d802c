"""`python -m sim.parallel` (also under torchrun): see sim/parallel/cli.py."""

import sys

from .cli import main

sys.exit(main())
