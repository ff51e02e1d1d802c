"""The app's one-line widgets: the token timeline, the panel tabs, the status line and the progress line.

Each is a Static that draws itself from what it is handed (`show`), so the app only says when.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from sim import render, render_cells
from sim.interventions import describe

from .panel import View, plural, quoted, twin_name


class Timeline(Static):
    """The tokens around the cursor (sim.render.timeline_text); the subtitle: the step, its input and
    output tokens, and the most likely next ones."""

    def on_mount(self) -> None:
        self.border_title = "Tokens"

    def show(self, view: View, visited: int) -> None:
        sim, f = view.sim, view.frame
        self.update(render.timeline_text(sim.frames, sim.prompt_len, view.step, visited,
                                         max(self.app.size.width - 4, 20)), layout=False)
        labelled = render.top_tokens(f, getattr(sim, "tokenizer", None))     # a real run labels with its own BPE
        tops = "  ".join(f"{quoted(text)} {p:.3f}" for text, p in labelled)
        prompt = " (prompt)" if view.step < sim.prompt_len - 1 else ""
        self.border_subtitle = (f"step {view.step} · position {f.position} · input {quoted(f.input_text)} → "
                                f"{quoted(f.token_text)}{prompt} · next: {tops}")


class PanelTabs(Static):
    """The compact layout's panel switcher: the shown panel reversed, the others clickable."""

    def show(self, panels: tuple[str, ...], shown: str) -> None:
        self.update(Text.from_markup("  ".join(
            (f"[reverse b] {i + 1} {name.title()} [/]" if name == shown else
             f"[@click=app.show_panel('{name}')] {i + 1} {name.title()} [/]") for i, name in enumerate(panels))
            + "   [dim]tab / 1-4 switch · z zoom[/]"), layout=False)


class TooSmall(Static):
    """Shown instead of the panels when the terminal is under the compact layout's size."""

    def show(self, size: tuple[int, int], least: tuple[int, int], full: tuple[int, int]) -> None:
        self.update(f"Terminal too small\n\ntiny-k3 needs at least {least[0]} x {least[1]} characters "
                    f"({full[0]} x {full[1]} shows all panels at once); this one is {size[0]} x {size[1]}.\n"
                    "Enlarge the window or make the font smaller:\nthe simulator keeps its place and comes back "
                    "when there is room.\n\nq quits.")


class StatusLine(Static):
    """Preset, step, layer, head, the step time, weights and device, then what is running."""

    def show(self, app) -> None:
        """app: the TinyK3App, read only (its driver, selection and toggles)."""
        d, cfg = app.driver, app.config
        parts = [f"[b]{app.preset}[/]"]
        if d.sim is not None:
            f = d.frames[app.step]
            parts.append(f"step {app.step}/{d.visited}")
            mlp = "MoE" if app.layer in cfg.moe_layers else "dense"
            parts.append(f"layer {app.layer} ({cfg.layer_kinds[app.layer].upper()} · {mlp})")
            parts.append(f"head {app.head}")
            ms = f"{f.step_ms:.1f} ms/step" if app.show_timings else "-- ms/step"
            twin = twin_name(d.sim)
            if app.compare:
                ms += f" ({twin} {f.twin_step_ms:.1f})" if app.show_timings else f" ({twin} --)"
            parts += [ms, d.weights, f"device {d.sim.device}"]
        if app.running:
            parts.append("[b green]▶ running[/]")
        if app.compare:
            parts.append(f"[b cyan]compare: hybrid vs {twin_name(d.sim) if d.sim is not None else 'twin'}[/]")
        if d.loading is not None:
            parts.append(f"[b yellow]loading {d.loading.spec.preset} …[/]")
        if d.whatif is not None:
            parts.append("[b magenta]what-if …[/]")
        self.update(Text.from_markup(" │ ".join(parts)), layout=False)


class ProgressLine(Static):
    """A load's prefill or a what-if's tokens, with a bar and Esc to cancel; hidden when neither runs."""

    def show(self, driver) -> None:
        ticket, p = driver.loading, driver.progress
        self.display = ticket is not None or driver.whatif is not None
        if ticket is None:
            if driver.whatif is not None:
                self.update(what_if_line(driver))
            return
        self.update(load_line(ticket, p))


def load_line(ticket, p) -> Text:
    """A load in flight: what it loads, then its prompt's tokens so far with a bar and their rate; the time left
    only once a few tokens have been timed (Progress.seconds_left: building a k3-topo model takes a minute, and
    the first token's time would promise hours)."""
    what = f"loading {ticket.spec.open_path or ticket.spec.preset} ({ticket.spec.expected_weights()})"
    if p is None:
        return Text(f"{what}: building the model … · Esc cancels", style="bold yellow")
    left = p.seconds_left
    timing = (f"{p.rate:.1f} tokens/s · about {left:.0f} s left" if left is not None else
              f"{p.rate:.1f} tokens/s" if p.rate is not None else "timing the first tokens")
    return Text.assemble((f"{what}: ", "bold yellow"), f"{p.done:,}/{plural(p.total, 'token')} ",
                         (render_cells.bar(p.done / max(p.total, 1), 20), "yellow"),
                         f" {p.done / max(p.total, 1):.0%} · {timing} · Esc cancels")


def what_if_line(driver) -> Text:
    """The what-if being computed: its changes, its step, its tokens so far."""
    job, p = driver.whatif, driver.whatif_progress
    what = ", ".join(describe(c) for c in job.changes) or "nothing"
    done = 0 if p is None else p.done
    return Text.assemble((f"what-if ({what}) at step {job.step}: ", "bold magenta"),
                         f"token {done}/{job.steps} ", (render_cells.bar(done / job.steps, 20), "magenta"),
                         " · Esc cancels; the timeline is untouched")
