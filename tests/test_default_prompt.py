"""The default prompt of the TUI, `python -m sim` and the lessons is a recall query the shipped model answers right."""

from __future__ import annotations

import pytest

from sim import Simulation
from sim.recall_moment import find_query
from tiny_k3 import DEFAULT_PRESET, DEFAULT_PROMPT
from tiny_k3.tokenizer import encode
from tiny_k3.weights import available_pretrained


@pytest.mark.skipif(DEFAULT_PRESET not in available_pretrained(), reason="no trained checkpoint ships")
def test_the_shipped_model_answers_the_default_prompt():
    ids = encode(DEFAULT_PROMPT)
    query = find_query(ids, len(ids) - 1)
    assert query is not None, f"the default prompt {DEFAULT_PROMPT!r} must end in a recall query like '| m='"
    sim = Simulation(DEFAULT_PRESET, DEFAULT_PROMPT, seed=0, twin=False)
    assert sim.frame.token_text == query.value, (
        f"the shipped {DEFAULT_PRESET!r} answers {DEFAULT_PROMPT!r} with {sim.frame.token_text!r}, not {query.value!r}")
    moment = sim.recall_moment()
    assert moment.predicted == query.value and moment.margin > 0


@pytest.mark.skipif(DEFAULT_PRESET not in available_pretrained(), reason="no trained checkpoint ships")
def test_the_readme_says_whether_the_state_panel_names_a_reading_head_at_the_default_prompt():
    """README: "... naming one as the reader only past a set share (this checkpoint names none there)": said
    exactly when the shipped checkpoint's recall moment has no reading head (one line to change on retraining)."""
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    moment = Simulation(DEFAULT_PRESET, DEFAULT_PROMPT, seed=0, twin=False).recall_moment()
    assert ("(this checkpoint names none there)" in readme) == (moment.reading_head is None), moment.reading_head
