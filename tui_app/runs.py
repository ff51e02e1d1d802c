"""What the app asks a load for and says about a run, in plain Python: the weights a load started in the app
asks for and the note when a preset ships none (`weights_for`, `weights_note`: as a fresh session does, also
after `--open`), and why a read-only run refuses, with what the app still offers (`read_only_note`)."""

from __future__ import annotations

from sim.presets import has_checkpoint, tui_presets


def weights_for(preset: str, loaded, asked: str) -> str:
    """The weights a load started in the app asks for, as a fresh session of that preset would: "random" where
    the learner chose a random init (`asked`, the command line's --weights, is "random", or `loaded`, the
    session on screen, runs this preset on random weights), else "auto": the shipped trained weights where the
    preset has them, a random init and a note (weights_note) where it has none. Never "trained": a reopened
    run's "trained" (or --weights trained) on a preset without shipped weights would only fail, with advice
    about a Python argument no key offers."""
    if asked == "random" or (preset == loaded.preset and loaded.weights == "random"):
        return "random"
    return "auto"


def weights_note(spec, sim) -> str:
    """After a load that asked for "auto" on a preset that ships no trained weights: it runs a random init, and
    which presets have trained ones; "" otherwise. The same note after a fresh start, a switch and a reopen."""
    if (spec.weights != "auto" or spec.open_path is not None or has_checkpoint(spec.preset) or sim is None
            or sim.weights != "random"):
        return ""
    shipped = [name for name in tui_presets() if has_checkpoint(name)]
    either = shipped[0] if len(shipped) == 1 else f"{', '.join(shipped[:-1])} or {shipped[-1]}"
    where = f"; p picks {either} for trained ones" if shipped else ""
    return f"{spec.preset} ships no trained weights, so it runs a random init (seed {spec.seed}){where}"


def read_only_note(sim) -> str | None:
    """Why a read-only run (streamed from a released checkpoint, sim.streamed_run) computes nothing, and what the
    app still does with it; None for a run that computes."""
    reason = getattr(sim, "read_only_reason", None)
    if not reason:
        return None
    return (f"{reason.rstrip('.')}. Here n and b walk its recorded frames, i steps into one, and p switches to a "
            f"preset that computes.")
