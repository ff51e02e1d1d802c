"""The Textual front end of tiny-k3. It reads the model only through sim (sim.presets, sim.render, the
Simulation and its Frames), never tiny_k3 itself. `tiny-k3` and `python tui.py` run tui.py beside this
package (installed as the top-level module `tui`), which checks the environment and calls cli.main.

    cli.py       the command line, checked (one sentence, exit 2), then the app run
    driver.py    plain-Python Driver: the Simulation, the cursor, the work queue (no Textual)
    app.py       TinyK3App: the layout, stepping, loading, drawing; its jobs run through one worker helper
    messages.py  how a job ends (JobOutcome, run_job) and comes back to the UI thread (JobProgress, JobFinished)
    navigation.py  keys that move the selection (layer, head, sublayer, expert) and the shown panel
    dialogs.py   keys that open a modal screen (palette, help, prompt, preset, what-if)
    panel.py     View (what a panel draws), Panel (the widget they all are), SideBySide
    panels.py    the routing, state, memory and depth panels (pure functions of a View)
    widgets.py   the one-line widgets: token timeline, panel tabs, status, progress, the too-small notice
    screens.py   modal screens: prompt, preset, help      help.py  the help text
    whatif_menu.py    x: the what-if choices that fit the focused panel, and their menu
    whatif_screen.py  a what-if's result beside the focused panel drawn on the branch
    commands.py  the command palette provider             footer.py  the keys that fit the width
    serve.py     the TUI in a browser (textual-serve)     tui.tcss  the stylesheet (ships as package data)
"""

from .app import FULL_HEIGHT, FULL_WIDTH, MIN_HEIGHT, MIN_WIDTH, TinyK3App

__all__ = ["TinyK3App", "MIN_WIDTH", "MIN_HEIGHT", "FULL_WIDTH", "FULL_HEIGHT"]
