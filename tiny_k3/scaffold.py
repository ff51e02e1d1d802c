"""A scaffold that comes down: how the hybrid's first MLA layer learns the look-up in K3's own shape (issue 34).

In `small` the first MLA layer sits at place 3, above three KDA layers. Trained as it is, it never learns to look
a key up: the layers below change while it learns, and without a short conv of its own it also needs them to hand
up the previous bytes (bench/results/recipe52/README.md, attempts 8-9, and its probe table). The scaffold:

1. **Grow** (steps 0 .. grow-1): a short conv (KDA's width) in front of every MLA layer that has none, and every
   layer below the first MLA layer *silent and frozen*: its sequence mixer's and its MLP's output projections are
   zero and none of its weights train. So the first MLA layer reads the embeddings through its own conv, which
   gives it the previous bytes, as the twin's first layer has them.
2. **Fade** (steps grow .. grow+fade): the layers below train again; the scaffold convs stop training and fade
   linearly from where they were to the identity taps (0, ..., 0, 1), while the layers below learn to hand up
   what the conv gave.
3. **Down**: an identity conv is no conv (it is linear), so the model is the plain config's exactly;
   `take_down` drops it and returns a TinyK3 of that config.

A model whose first layer is MLA (the twin) or that has no MLA layer (`small-kda`) has nothing to scaffold:
every step here is a no-op for it, so the three checkpoints share one recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import K3Config
from .model import TinyK3


def layers_below_first_mla(config: K3Config) -> range:
    """The layers under the first MLA layer (none when layer 0 is MLA or no layer is)."""
    mla = config.mla_layers
    return range(mla[0] if mla else 0)


def scaffold_conv_layers(config: K3Config) -> tuple[int, ...]:
    """The MLA layers that get a scaffold conv: those without a short conv of their own, where layers lie below
    the first MLA layer (otherwise nothing is scaffolded)."""
    if not layers_below_first_mla(config):
        return ()
    return tuple(i for i in config.mla_layers if i not in config.mla_conv_layers)


def scaffolded_config(config: K3Config) -> K3Config:
    """`config` with the scaffold convs in front of its MLA layers (`config` itself where there are none)."""
    extra = scaffold_conv_layers(config)
    if not extra:
        return config
    return config.replace(mla_conv_layers=tuple(sorted({*config.mla_conv_layers, *extra})))


def silence(block) -> None:
    """Zero a block's sequence-mixer output projection (KDA; an MLA one too) and its MLP's output (dense w2, or
    the MoE's up-projection and shared expert's w2): the block then adds nothing to the residual stream."""
    with torch.no_grad():
        block.attn.o_proj.weight.zero_()
        mlp = block.mlp
        if hasattr(mlp, "up"):                       # MoE: the experts' sum leaves through `up` (moe.py)
            mlp.up.weight.zero_()
            if mlp.shared is not None:
                mlp.shared.w2.weight.zero_()
        else:
            mlp.w2.weight.zero_()


def identity_taps(weight: torch.Tensor) -> torch.Tensor:
    """Conv1d weight [C, 1, W] -> the taps that pass each channel's current token through unchanged."""
    taps = torch.zeros_like(weight)
    taps[..., -1] = 1.0
    return taps


@dataclass
class Scaffold:
    """The scaffold's schedule (module docstring): grow for `grow` steps, then fade over `fade` steps."""

    grow: int = 200
    fade: int = 100
    _start: list[torch.Tensor] = field(default_factory=list, repr=False)   # the convs when the fade began

    def __post_init__(self):
        if self.grow < 1 or self.fade < 1:
            raise ValueError(f"the scaffold takes GROW,FADE as two positive step counts, got {self.grow},{self.fade}.")

    @property
    def down_at(self) -> int:
        """The first step that trains the plain config's model exactly (the convs are the identity from here)."""
        return self.grow + self.fade - 1

    def put_up(self, model: TinyK3, plain: K3Config) -> None:
        """At init: silence and freeze the layers below the first MLA layer of `plain` (model is scaffolded)."""
        for i in layers_below_first_mla(plain):
            silence(model.blocks[i])
            model.blocks[i].requires_grad_(False)

    def before_step(self, model: TinyK3, plain: K3Config, step: int, log=print) -> None:
        """Release the layers below at `grow`; from then on set the scaffold convs on their fade to the identity."""
        convs = [model.blocks[i].attn.short_conv.weight for i in scaffold_conv_layers(plain)]
        if not convs:
            return
        if step == self.grow:
            for i in layers_below_first_mla(plain):
                model.blocks[i].requires_grad_(True)
            self._start = [w.detach().clone() for w in convs]
            for w in convs:
                w.requires_grad_(False)
            log(f"step {step}: scaffold: layers {list(layers_below_first_mla(plain))} released; the MLA convs "
                f"fade to the identity over {self.fade} steps")
        if self.grow <= step <= self.down_at:   # (step grow + k sets k + 1 fade-th parts)
            done = min(1.0, (step - self.grow + 1) / self.fade)
            with torch.no_grad():
                for w, start in zip(convs, self._start):
                    w.copy_((1 - done) * start + done * identity_taps(start))

    def take_down(self, model: TinyK3, plain: K3Config) -> TinyK3:
        """The scaffolded `model`, after the fade, as a TinyK3 of `plain`: its scaffold convs must be the identity
        exactly (ValueError otherwise, e.g. a run shorter than grow + fade)."""
        layers = scaffold_conv_layers(plain)
        if not layers:
            return model
        state = model.state_dict()
        for i in layers:
            w = state.pop(f"blocks.{i}.attn.short_conv.weight")
            if not torch.equal(w, identity_taps(w)):
                raise ValueError(f"the scaffold conv of layer {i} is not the identity yet: a run must last at "
                                 f"least grow + fade = {self.down_at + 1} steps.")
        plain_model = TinyK3(plain, device=model.device, dtype=next(model.parameters()).dtype)
        plain_model.load_state_dict(state)
        plain_model.train(model.training)
        return plain_model


def parse_scaffold(text: str) -> Scaffold:
    """"GROW,FADE" (train --scaffold) -> Scaffold; a one-line ValueError otherwise."""
    try:
        grow, fade = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--scaffold takes GROW,FADE, two step counts such as 200,100, got {text!r}.") from None
    return Scaffold(grow, fade)


__all__ = ["Scaffold", "layers_below_first_mla", "scaffold_conv_layers", "scaffolded_config", "silence",
           "identity_taps", "parse_scaffold"]
