"""The what-if menu (`x`): the changes that fit the focused panel at this token, layer and head.

`menu_for` lists them as (label, changes) from the View the panels draw (routing: ablate a chosen or the
busiest expert, force the next k in line, no selection bias; state: reset this head / this layer / every
KDA layer, scale the decay; depth: uniform AttnRes weights; memory: the MLA layers see only a window of
the context). `unavailable` says in one sentence why a panel has none. `WhatIfMenu` lets the learner pick
one; the app hands the choice to the driver (`Driver.request_what_if`), which runs it in a worker.
"""

from __future__ import annotations

import numpy as np
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from sim.interventions import (AblateExpert, ForceExperts, NoSelectionBias, ResetState, ScaleDecay, TruncateContext,
                               UniformDepth)

from .panel import View, plural
from .screens import Dialog

# the command palette's what-ifs: whole-model changes that need no panel, layer or head
PALETTE = (("reset every KDA state", (ResetState(),)), ("no selection bias anywhere", (NoSelectionBias(),)),
           ("uniform depth weights everywhere", (UniformDepth(),)),
           ("MLA layers see only the last 4 tokens", (TruncateContext(4),)),
           ("no forgetting in KDA (decay x0)", (ScaleDecay(factor=0.0),)))
WINDOWS = (1, 4, 16, 64)   # the context windows the memory panel offers, those shorter than the context


def _routing(v: View) -> list[tuple[str, tuple]]:
    cfg, layer, r = v.config, v.layer, v.frame.routing_for(v.layer)
    items = [(f"ablate expert {e} at L{layer} (chosen #{rank}, weight {float(r.weights[rank]):.3f})",
              (AblateExpert(layer, e),)) for rank, e in enumerate(r.expert_ids[:3].tolist())]
    load = v.sim.expert_load(layer, upto=v.step)
    busiest = int(np.argmax(load))
    items.append((f"ablate the busiest expert so far at L{layer}: {busiest} ({int(load[busiest])} of "
                  f"{plural(v.step + 1, 'token')})", (AblateExpert(layer, busiest),)))
    k = cfg.top_k
    runners_up = np.argsort(-(r.scores + r.bias), kind="stable")[k:2 * k].tolist()
    if len(runners_up) == k:
        shown = ", ".join(map(str, runners_up[:3])) + (", …" if k > 3 else "")
        items.append((f"force the next {k} in line at L{layer} (experts {shown})",
                      (ForceExperts(layer, tuple(runners_up)),)))
    items.append((f"no selection bias at L{layer}", (NoSelectionBias(layer),)))
    items.append(("no selection bias in every MoE layer", (NoSelectionBias(),)))
    return items


def _state(v: View) -> list[tuple[str, tuple]]:
    layer, head = v.kda_layer, v.kda_head
    items = []
    best = v.reading_head
    if best is not None:                    # at a recall query: wipe the head that reads the value back
        q = v.recall.query
        items.append((f"reset L{best.layer} h{best.head}, the head that reads back {q.key}={q.value}",
                      (ResetState(best.layer, best.head),)))
    needed = None if v.recall is None or not v.recall.answered else v.recall.most_needed_head
    if needed is not None and (best is None or (needed.layer, needed.head) != (best.layer, best.head)):
        q = v.recall.query                  # the head whose reset alone lowers p(answer) most (measured)
        items.append((f"reset L{needed.layer} h{needed.head}, the head whose reset lowers p({q.value}) most",
                      (ResetState(needed.layer, needed.head),)))
    named = {(h.layer, h.head) for h in (best, needed) if h is not None}
    if (layer, head) not in named:                                   # the shown head, unless it is named above
        items.append((f"reset head {head} of KDA layer {layer}", (ResetState(layer, head),)))
    return items + [(f"reset KDA layer {layer}", (ResetState(layer),)),
                    ("reset every KDA layer", (ResetState(),)),
                    (f"no forgetting at L{layer} (decay x0)", (ScaleDecay(layer, 0.0),)),
                    (f"forget twice as fast at L{layer} (decay x2)", (ScaleDecay(layer, 2.0),)),
                    ("no forgetting anywhere (decay x0)", (ScaleDecay(factor=0.0),))]


def _memory(v: View) -> list[tuple[str, tuple]]:
    tokens = v.frame.position + 1
    return [(f"MLA layers see only the last {plural(w, 'token')} (of {tokens})", (TruncateContext(w),))
            for w in WINDOWS if w < tokens]


def menu_for(panel: str, v: View) -> list[tuple[str, tuple]]:
    """(label, changes) for the focused panel at the View's frame, layer and head; [] when nothing applies."""
    cfg = v.config
    if panel == "routing" and v.layer in cfg.moe_layers:
        return _routing(v)
    if panel == "state" and cfg.kda_layers:
        return _state(v)
    if panel == "depth" and cfg.residual != "standard":
        return [(f"uniform depth weights at L{v.layer}", (UniformDepth(v.layer),)),
                ("uniform depth weights everywhere", (UniformDepth(),))]
    if panel == "memory" and cfg.mla_layers:
        return _memory(v)
    return []


def unavailable(panel: str, v: View) -> str:
    """Why `menu_for(panel, v)` is empty, in one sentence that says where a what-if is possible."""
    cfg = v.config
    if panel == "routing":
        if not cfg.moe_layers:
            return f"Preset {cfg.name!r} has no MoE layers, so there is no routing to change."
        return (f"Layer {v.layer} has a dense MLP, so nothing is routed there; j/k to an MoE layer "
                f"({cfg.moe_layers[0]} to {cfg.moe_layers[-1]}).")
    if panel == "state":
        return f"Preset {cfg.name!r} has no KDA layers, so there is no recurrent state to reset or rescale."
    if panel == "depth":
        return f"Preset {cfg.name!r} uses the standard residual, so there are no depth weights to change."
    if not cfg.mla_layers:
        return f"Preset {cfg.name!r} has no MLA layers, so there is no attention context to truncate."
    return (f"The context is {plural(v.frame.position + 1, 'token')}, so no window is shorter than it yet; "
            f"n a few tokens on.")


class WhatIfMenu(Dialog):
    """Pick one change (Enter runs it) or none (Escape)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, items: list[tuple[str, tuple]], note: str, steps: int):
        super().__init__()
        self.title_text, self.items, self.note, self.steps = title, items, note, steps

    def compose(self) -> ComposeResult:
        with Vertical(id="whatif-menu-box", classes="dialog"):
            yield Static(self.title_text, classes="dialog-label")
            if self.items:
                yield OptionList(*(Option(label, id=str(i)) for i, (label, _) in enumerate(self.items)),
                                 id="whatif-menu")
                yield Static(f"Enter recomputes this token and {plural(self.steps - 1, 'more token')} with the change, "
                             f"beside the original; Escape cancels.", classes="hint")
            else:
                yield Static(self.note, id="whatif-none")
                yield Static("Escape closes; other panels (tab, 1-4) have their own what-ifs.", classes="hint")

    def on_mount(self) -> None:
        if self.items:
            self.after_composed(lambda: setattr(self.query_one(OptionList), "highlighted", 0), "OptionList")

    @on(OptionList.OptionSelected)
    def pick(self, event: OptionList.OptionSelected) -> None:
        if not self.closing:
            self.dismiss(self.items[int(event.option.id)][1])

    def action_cancel(self) -> None:
        self.dismiss(None)
