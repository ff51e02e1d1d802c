"""The Textual front end of tiny-k3 (the entry point is tui.py beside this package).

    driver.py    plain-Python Driver: the Simulation, the cursor, the work queue (no Textual)
    app.py       TinyK3App: keys -> driver calls, thread workers, dataclass messages, layouts
    panels.py    the routing, state, memory and depth panels (pure functions of a View)
    screens.py   modal screens: prompt, preset, help      help.py  the help text
    whatif_menu.py    x: the what-if choices that fit the focused panel, and their menu
    whatif_screen.py  a what-if's result beside the focused panel drawn on the branch
    commands.py  the command palette provider             tui.tcss the stylesheet (ships as package data)
"""

from .app import FULL_HEIGHT, FULL_WIDTH, MIN_HEIGHT, MIN_WIDTH, TinyK3App

__all__ = ["TinyK3App", "MIN_WIDTH", "MIN_HEIGHT", "FULL_WIDTH", "FULL_HEIGHT"]
