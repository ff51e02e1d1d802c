"""tiny-k3's main job: step through generation and watch MoE routing, the KDA state, the cache and AttnRes.

    python tui.py [--preset small] [--prompt "key=7; 3+4="] [--seed 0] [--weights auto] [--device cpu]
    python tui.py --open RUN.npz        # a run saved with `s` (in runs/), at the step it was saved
    python3 dev.py run --open runs/RUN.npz   # the same through dev.py, from the checkout

This top-level module is what `tiny-k3` runs (pyproject.toml installs it into site-packages as `tui`): it
checks that this Python is the project's environment, then hands over to tui_app.cli (the command line)
and tui_app.app (the app).
"""

from __future__ import annotations

import sys

try:  # the project's environment has these; a bare system Python usually does not
    import numpy  # noqa: F401
    import rich  # noqa: F401
    import textual  # noqa: F401
    import torch  # noqa: F401
except ModuleNotFoundError as _missing:
    sys.exit(f"tiny-k3: this Python has no {_missing.name!r} module, so it is not the project's environment; "
             f"run `python3 dev.py run` instead (it sets up .venv on first use and starts the TUI).")

from tui_app import TinyK3App  # noqa: E402 - after the environment check
from tui_app.cli import UsageError, main, parse_args  # noqa: E402

__all__ = ["TinyK3App", "UsageError", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
