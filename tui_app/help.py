"""The help (`?`): the keys and what each panel shows, as two-column tables whose descriptions wrap inside
their own column (readable at 80 columns); the help screen scrolls where the terminal is shorter."""

from rich.console import Group
from rich.table import Table
from rich.text import Text

KEYS = (
    ("n / →", "next token (computed ahead, so it is instant)"),
    ("b / ←", "back one token"),
    ("x", "what if …: change the model at this token for the focused panel (ablate an expert, reset a KDA "
          "state, uniform depth weights, a shorter MLA context) and compare; n / b walk the steps, escape "
          "returns to the timeline, untouched (while it computes, escape cancels it)"),
    ("r", "run / pause (it pauses once where the memory lines cross)"),
    ("j / k", "next / previous layer (stepped into a token: sublayer)"),
    ("h / H", "next / previous KDA head"),
    ("i / o", "step into / out of the token's layers"),
    ("e", "edit the prompt"),
    ("p", "switch preset: it opens on this one, ↑ ↓ pick another (small-twin: the shipped all-softmax twin)"),
    ("s", "save the run to runs/ (reopen: python3 dev.py run --open FILE)"),
    ("c", "compare with the all-softmax twin (an all-MLA preset such as small-twin has none)"),
    ("z", "zoom the focused panel / restore"),
    ("tab, 1-4", "focus a panel (small terminals: show it)"),
    ("ctrl+p", "command palette: go to layer / expert / step, presets, what-ifs"),
    ("escape", "cancel a load, or a what-if being computed"),
    ("?", "this help"),
    ("q", "quit"),
)

PANELS = (
    ("Routing", "all E experts of the selected MoE layer; the k chosen are lit, the rest shaded by score. "
                "Only k of E experts run per token: total parameters set the memory bill, active ones the "
                "compute."),
    ("State", "a KDA head's K x V memory S after this token (red to yellow positive, blue to cyan negative, "
              "scaled to the 99th percentile of |S|; the key gives the numbers), its per-channel decay alpha and "
              "write strength beta, and the delta-rule correction this token wrote. Its size never grows."),
    ("Memory", "measured cache bytes of this hybrid vs the same model with every layer softmax (MLA): the "
               "hybrid starts larger (its fixed KDA states) and the twin overtakes it; then K3 now and at 1M."),
    ("Depth", "Attention Residuals: each sublayer (row) reads a softmax mix of the earlier blocks (columns: "
              "emb, b1, b2, ..., partial), not a fixed sum; the brighter the green, the larger the weight (key)."),
)

RECALL = ('At a recall query ("| z=" after "z=1;"), State opens on the KDA head that reads the value back: '
          'the one whose read S^T q is mostly the write made at the value token "1" (named only when the model '
          'answers right); j/k/h/H go back to your selection. Depth marks the 3 sublayers that pushed the '
          "answer's logit most (share of its margin).")


def _table(rows: tuple[tuple[str, str], ...], key_width: int) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, min_width=key_width, style="bold")
    table.add_column(ratio=1)
    for key, text in rows:
        table.add_row(key, text)
    return table


def help_renderable() -> Group:
    return Group(Text.from_markup("[b]tiny-k3[/b]: a Kimi K3-style model, one token and one layer at a time."),
                 Text(), Text("Keys", style="bold"), _table(KEYS, 8), Text(),
                 Text("Panels", style="bold"), _table(PANELS, 8), Text(), Text(RECALL), Text(),
                 Text("Escape or ? closes this help; ↑ ↓ and the page keys scroll it."))
