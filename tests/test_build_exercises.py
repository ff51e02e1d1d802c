"""The "Build it yourself" thread (lessons 2, 3, 6): its checks teach, its solutions pass, and the lessons' last
cells run the model on the learner's function.

The wrong implementations are mistakes a learner makes; each must fail with the message that names it. The
lesson sections are run as a learner sees them (stubs: "not done yet") and as an instructor does (solutions:
passed, and the model on the solution equals the model's own).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import jupytext
import pytest
import torch
import torch.nn.functional as F

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))

import checks  # noqa: E402
import solutions  # noqa: E402
import workshop  # noqa: E402
from test_exercises import fails_with  # noqa: E402  (the lessons' own checks' helper: raises, names the mistake)
from checks.build import (TOLERANCE, against, check_attend_with_cache, check_delta_chunked,  # noqa: E402
                          check_delta_step, check_kda_head, check_mla_decode, run_your_layer)

SOLVED = {check_delta_step: solutions.delta_step, check_delta_chunked: solutions.delta_chunked,
          check_kda_head: solutions.kda_head, check_attend_with_cache: solutions.attend_with_cache,
          check_mla_decode: solutions.mla_decode}
BUILD = [c.exercise for c in SOLVED]


@pytest.mark.parametrize("check", list(SOLVED), ids=lambda c: c.__name__)
def test_reference_solution_passes(check, capsys):
    check(SOLVED[check])
    assert f"✓ {check.__name__} passed" in capsys.readouterr().out
    assert check.exercise.solution == SOLVED[check].__name__ and len(check.expects) > 80


def test_the_thread_is_registered_for_hint_but_not_among_the_lessons_own_checks(capsys):
    assert [ex.number for ex in BUILD] == ["B.1", "B.2", "B.3", "B.4", "B.5"]
    assert not set(SOLVED) & set(checks.ALL_CHECKS)
    for ex in BUILD:
        assert checks.find_exercise(ex.number) is ex and ex.difficulty in (1, 2, 3) and 3 <= ex.minutes <= 30
        checks.hint(ex.number, 3)
        assert "hint 3/3" in capsys.readouterr().out


def _code_lines(fn) -> list[str]:
    """The solution's code, line by line, without docstrings and comments (lines of 12+ characters)."""
    import inspect

    source = re.sub(r'"""[\s\S]*?"""', "", inspect.getsource(fn))
    lines = [line.split("#")[0].strip() for line in source.splitlines()]
    return [line for line in lines if len(line) >= 12 and not line.startswith("def ")]


@pytest.mark.parametrize("ex", BUILD, ids=lambda e: e.number)
def test_three_rungs_and_no_code_before_the_last(ex):
    assert len(ex.hints) == 3
    idea, shape, code = ex.hints
    for rung in (idea, shape):
        for marker in ("torch.", "einsum(", ".exp()", "softmax(", " = ", "[:, ", "(-1)"):
            assert marker not in rung, (ex.number, marker, rung)
        for line in _code_lines(getattr(solutions, ex.solution)):
            assert line not in rung, (ex.number, line)
    assert any(marker in code for marker in ("einsum", "torch.", "@")), "the last rung is the code"


# ---------------------------------------------------------------------------- B.1 the step

def _step(S, q, k, v, g, beta, scale, *, decay=None, delta=True, use_beta=True, recall_old=False, read="new",
          read_scale=None):
    """The step with one switch flipped: the mistakes below."""
    dec = (g.exp()[..., None] if decay is None else decay(g)) * S
    src = S if recall_old else dec
    err = v - torch.einsum("hk,hkv->hv", k, src) if delta else v
    new = dec + (beta[:, None, None] if use_beta else 1.0) * k[..., None] * err[:, None, :]
    state = {"new": new, "old": S, "decayed": dec}[read]
    return torch.einsum("hk,hkv->hv", (scale if read_scale is None else read_scale) * q, state), new


def test_delta_step_mistakes_are_named():
    c = check_delta_step
    fails_with(c, lambda *a: _step(*a, decay=lambda g: g.mean(-1).exp()[:, None, None]), "Gated DeltaNet")
    fails_with(c, lambda *a: _step(*a, decay=lambda g: g[..., None]), "*log* decay")
    fails_with(c, lambda *a: _step(*a, delta=False), "linear attention", "only the error")
    fails_with(c, lambda *a: _step(*a, recall_old=True), "*decayed* state")
    fails_with(c, lambda *a: _step(*a, use_beta=False), "left out β")
    fails_with(c, lambda *a: _step(*a, read="decayed"), "before the write")
    fails_with(c, lambda *a: _step(*a, read_scale=1.0), "no scale")
    fails_with(c, lambda S, q, *a: _step(S, q, *a[:-1], a[-1], read_scale=q.shape[-1] ** -0.5), "K^-0.5")
    fails_with(c, lambda S, *a: (S[..., 0], S), "o has shape")


def test_a_delta_step_with_the_wrong_sign_is_named_with_how_far_off_it_is():
    """The likeliest slip, β k (S'ᵀk − v)ᵀ: named, with the largest difference and how much further from v it
    leaves each head's recall than the right step."""
    message = fails_with(check_delta_step, lambda S, q, k, v, g, beta, scale: _step(S, q, k, v, g, -beta, scale),
                         "wrong sign", "AWAY from v", "largest difference", "misses v by")
    number = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
    off, wrong, right = (float(x) for x in re.findall(
        rf"largest difference {number}, and S_newᵀk misses v by {number} where the right state misses it by {number}",
        message)[0])
    assert off > 0 and wrong > right, message
    # the chunked form and the head name it too (there it is the same as a negative β)
    fails_with(check_delta_chunked, lambda q, k, v, g, b, s, C, S0=None: solutions.delta_chunked(q, k, v, g, -b, s, C, S0),
               "wrong sign", "largest difference")
    fails_with(check_kda_head, lambda *a: _head(*a, sign=-1.0), "wrong sign", "check_delta_step")


def test_a_near_miss_says_how_far_off_it_is():
    def slightly_off(*a):
        o, S = solutions.delta_step(*a)
        return o, S * (1 + 1e-7)

    fails_with(check_delta_step, slightly_off, "S_new is wrong", "largest difference", "the check asks 1e-09")


def test_delta_step_recognises_column_decay_where_K_equals_V():
    fails_with(check_delta_step, lambda *a: _step(*a, decay=lambda g: g.exp()[:, None, :])
               if a[0].shape[1] == a[0].shape[2] else solutions.delta_step(*a), "*columns*")


# ---------------------------------------------------------------------------- B.2 the chunked form

def test_delta_chunked_mistakes_are_named():
    c = check_delta_chunked

    def restart_each_chunk(q, k, v, g, beta, scale, C, S0=None):
        outs = [solutions.delta_chunked(q[s:s + C], k[s:s + C], v[s:s + C], g[s:s + C], beta[s:s + C], scale, C, S0)
                for s in range(0, q.shape[0], C)]
        return torch.cat([o for o, _ in outs]), outs[-1][1]

    def whole_chunks_only(q, k, v, g, beta, scale, C, S0=None):
        T = q.shape[0]
        if T <= C or T % C == 0:
            return solutions.delta_chunked(q, k, v, g, beta, scale, C, S0)
        o, S = solutions.delta_chunked(q, k, v, g, beta, scale, C, S0)
        return torch.cat([o[:T // C * C], torch.zeros_like(o[T // C * C:])]), S

    fails_with(c, lambda q, k, v, g, b, s, C, S0=None: solutions.delta_chunked(q, k, v, g, b, 1.0, C, S0), "scale")
    fails_with(c, lambda q, k, v, g, b, s, C, S0=None: solutions.delta_chunked(q, k, v, g, b, s, C), "S0 is missing")
    def halve_the_handed_on_state(q, k, v, g, beta, scale, C, S0=None):
        outs, S = [], S0
        for s in range(0, q.shape[0], C):
            o, S = solutions.delta_chunked(q[s:s + C], k[s:s + C], v[s:s + C], g[s:s + C], beta[s:s + C], scale, C, S)
            outs.append(o)
            S = 0.5 * S
        return torch.cat(outs), 2.0 * S

    fails_with(c, restart_each_chunk, "carry the state")
    fails_with(c, halve_the_handed_on_state, "the state you hand on")
    fails_with(c, whole_chunks_only, "last, shorter one")
    fails_with(c, lambda q, *a: (torch.zeros(q.shape[0] - 1, *q.shape[1:]), None), "o has shape")


def test_delta_chunked_is_compared_with_the_learners_own_step(capsys):
    against(check_delta_chunked, step=solutions.delta_step)(solutions.delta_chunked)
    assert "and your own my_delta_step" in capsys.readouterr().out
    wrong_step = lambda *a: _step(*a, use_beta=False)   # noqa: E731
    fails_with(against(check_delta_chunked, step=wrong_step), solutions.delta_chunked,
               "not with your own my_delta_step", "check_delta_step")

    def not_written(*a):
        raise NotImplementedError

    against(check_delta_chunked, step=not_written)(solutions.delta_chunked)
    assert "not yet with your own step" in capsys.readouterr().out
    wrapped = against(check_delta_chunked, step=solutions.delta_step)
    assert wrapped.exercise is check_delta_chunked.exercise and wrapped.__name__ == "check_delta_chunked"


# ---------------------------------------------------------------------------- B.3 a KDA head

def _head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lb, S0=None, *, norm="layer", gate="right", sig=True,
          use_S0=True, sign=1.0):
    if norm == "layer":
        q, k = (x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    elif norm == "F":
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    x, a = g_raw + dt_bias, A_log.exp()
    if gate == "right":
        g = -a * F.softplus(x) if lb is None else lb * torch.sigmoid(a * x)
    else:
        g = -a * F.softplus(x)
    beta = sign * (torch.sigmoid(beta_logit) if sig else beta_logit)
    K = q.shape[-1]
    S = torch.zeros(K, v.shape[-1], dtype=q.dtype) if S0 is None or not use_S0 else S0
    outs = []
    for t in range(q.shape[0]):
        o, S = solutions.delta_step(S[None], q[t, None], k[t, None], v[t, None], g[t, None], beta[t, None], K ** -0.5)
        S = S[0]
        outs.append(o[0])
    return torch.stack(outs), S


def test_kda_head_mistakes_are_named():
    c = check_kda_head
    fails_with(c, lambda *a: _head(*a, norm=None), "unit vectors")
    fails_with(c, lambda *a: _head(*a, norm="F"), "1e-6 inside the root")
    fails_with(c, lambda *a: _head(*a, gate="softplus"), "bounded gate")
    fails_with(c, lambda *a: _head(*a, sig=False), "sigmoid(beta_logit)")
    fails_with(c, lambda *a: _head(*a, use_S0=False), "start from S0")


# ---------------------------------------------------------------------------- B.4 attention with a KV cache

def _attend(cache, q, k, v, scale, *, use_scale=None, axis=-1, before=False, keep_cache=True):
    keys = k[None] if cache is None else torch.cat([cache[0], k[None]])
    values = v[None] if cache is None else torch.cat([cache[1], v[None]])
    seen_k, seen_v = (keys[:-1], values[:-1]) if before and cache is not None else (keys, values)
    w = (torch.einsum("hd,shd->hs", q, seen_k) * (scale if use_scale is None else use_scale(q))).softmax(axis)
    out = torch.einsum("hs,shv->hv", w, seen_v)
    return out, (keys, values) if keep_cache else (k[None], v[None])


def test_attend_with_cache_mistakes_are_named():
    c = check_attend_with_cache
    fails_with(c, lambda *a: _attend(*a, use_scale=lambda q: 1.0), "left out the scale")
    fails_with(c, lambda *a: _attend(*a, use_scale=lambda q: q.shape[-1] ** -0.5), "not 1/sqrt(D)")
    fails_with(c, lambda *a: _attend(*a, axis=0), "over the heads")
    fails_with(c, lambda *a: _attend(*a, before=True), "before appending")
    fails_with(c, lambda *a: _attend(*a, keep_cache=False), "append, never replace")
    fails_with(c, lambda *a: _attend(*a)[0], "Return two things")


# ---------------------------------------------------------------------------- B.5 MLA's absorbed decode

def test_mla_decode_mistakes_are_named():
    c, solve = check_mla_decode, solutions.mla_decode
    fails_with(c, lambda qn, qr, lat, kr, Wk, Wv, s: solve(qn, torch.zeros_like(qr), lat, kr, Wk, Wv, s), "rope part")
    fails_with(c, lambda *a: solve(*a[:-1], 1.0), "left out the scale")
    fails_with(c, lambda qn, *a: solve(qn, *a[:-1], qn.shape[-1] ** -0.5), "1/sqrt(nope)")

    def heads_softmax(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale):
        q_latent = torch.einsum("hn,hnr->hr", q_nope, W_kb)
        p = ((q_latent @ latent.T + q_rope @ k_rope.T) * scale).softmax(0)
        return torch.einsum("hr,hvr->hv", p @ latent, W_vb)

    fails_with(c, heads_softmax, "over the heads")


# ---------------------------------------------------------------------------- the model on the learner's layer

@pytest.fixture(scope="module")
def small64():
    model, _ = workshop.load_model("small")
    return model.double().eval()


@pytest.mark.parametrize("role", ["kda_head", "attention", "mla_decode"])
def test_the_model_on_the_solution_is_the_models_own(small64, role, capsys):
    fn = {"kda_head": solutions.kda_head, "attention": solutions.attend_with_cache,
          "mla_decode": solutions.mla_decode}[role]
    result = run_your_layer(small64, workshop_prompt(), **{role: fn})
    out = capsys.readouterr().out
    assert result is not None and result.max_abs_diff <= TOLERANCE
    assert f"≤ {TOLERANCE:g}: the same function" in out
    from tiny_k3.tokenizer import token_text

    own, yours = result.next_tokens()
    text = token_text(own)
    assert own == yours and f"next token: {text!r} from your layer, {text!r} from the model's own" in out


def workshop_prompt() -> str:
    from tiny_k3 import DEFAULT_PROMPT

    return DEFAULT_PROMPT


def test_the_b2_hint_code_runs_as_it_stands(capsys):
    """B.2's last rung is the whole function: pasted as it is, it passes the check (against tiny_k3 and the
    reference step)."""
    code = checks.find_exercise("B.2").hints[-1]
    namespace: dict = {}
    exec(compile(code, "hint('B.2', 3)", "exec"), namespace)
    against(check_delta_chunked, step=solutions.delta_step)(namespace["my_delta_chunked"])
    assert "✓ check_delta_chunked passed" in capsys.readouterr().out


def test_b2_runs_inside_the_model(small64, capsys):
    """The learner's chunked form as every KDA head's prefill: the solution gives the model's own logits, a wrong
    chunked form does not, a stub says "not yet"."""
    from checks.build import CHUNK
    from tiny_k3.tokenizer import encode

    assert len(encode(workshop_prompt())) > 2 * CHUNK, "several chunks, so the state is handed on inside the model"
    result = run_your_layer(small64, workshop_prompt(), delta_chunked=solutions.delta_chunked)
    out = capsys.readouterr().out
    assert result is not None and result.max_abs_diff <= TOLERANCE and "delta_chunked as delta_chunked" in out
    assert f"≤ {TOLERANCE:g}: the same function" in out

    def restart_each_chunk(q, k, v, g, beta, scale, C, S0=None):
        outs = [solutions.delta_chunked(q[s:s + C], k[s:s + C], v[s:s + C], g[s:s + C], beta[s:s + C], scale, C, S0)
                for s in range(0, q.shape[0], C)]
        return torch.cat([o for o, _ in outs]), outs[-1][1]

    result = run_your_layer(small64, workshop_prompt(), delta_chunked=restart_each_chunk)
    assert result.max_abs_diff > 1e3 * TOLERANCE and "NOT the same function" in capsys.readouterr().out

    def stub(*a):
        raise NotImplementedError

    assert run_your_layer(small64, workshop_prompt(), delta_chunked=stub) is None
    assert "not yet: write the exercise above first" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["keeps the old cache", "keeps only the new token", "drops the oldest token"])
def test_b4_a_cache_that_does_not_grow_fails_inside_the_model_and_says_why(small64, kind, capsys):
    """A function whose cache does not grow by the new token: the model cell refuses it and says why, in the
    lesson's words (before tiny_k3.swap's own check of the length)."""
    def attend(cache, q, k, v, scale):
        o, grown = solutions.attend_with_cache(cache, q, k, v, scale)        # attends over all tokens, as it should
        if kind == "keeps the old cache":
            return o, cache
        if kind == "keeps only the new token":
            return o, (k[None], v[None])
        return o, (grown[0][1:], grown[1][1:]) if grown[0].shape[0] > 2 else grown

    fails_with(check_attend_with_cache, attend)                            # the check itself fails it already
    assert run_your_layer(small64, workshop_prompt(), attention=attend) is None
    out = capsys.readouterr().out
    assert "✗" in out and "Your KV cache does not grow" in out and "the same function" not in out, out
    assert "it must hold every token so far" in out


def test_b4_a_cache_that_grows_but_rewrites_the_past_fails_inside_the_model(small64, capsys):
    def attend(cache, q, k, v, scale):
        o, (keys, values) = solutions.attend_with_cache(cache, q, k, v, scale)
        return o, (torch.cat([keys[:-1] * (1 + 1e-6), keys[-1:]]), values)     # the new row right, the past not

    assert run_your_layer(small64, workshop_prompt(), attention=attend) is None
    assert "changed the tokens before it" in capsys.readouterr().out


def test_the_model_on_a_wrong_or_unwritten_function_says_so(small64, capsys):
    result = run_your_layer(small64, workshop_prompt(), attention=lambda *a: _attend(*a, use_scale=lambda q: 1.0))
    assert result.max_abs_diff > 1e3 * TOLERANCE and "NOT the same function" in capsys.readouterr().out

    def stub(*a):
        raise NotImplementedError

    assert run_your_layer(small64, workshop_prompt(), kda_head=stub) is None
    assert "not yet: write the exercise above first" in capsys.readouterr().out
    assert run_your_layer(small64, workshop_prompt(), mla_decode=lambda *a: a[0] @ a[1]) is None
    assert "your function raised RuntimeError" in capsys.readouterr().out


# ---------------------------------------------------------------------------- the lesson sections, both modes

SECTIONS = {"02_delta_rule.py": 3, "03_memory_that_does_not_grow.py": 1, "06_walk_one_token.py": 1}


def _section(name: str) -> list:
    """The code cells of a lesson's "Build it yourself" section (its last section)."""
    cells = jupytext.read(LESSONS / name).cells
    start = max(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Build it yourself" in c.source)
    return [c for c in cells[start:] if c.cell_type == "code"]


def _run_section(name: str, solved: bool, capsys) -> tuple[str, float]:
    workshop.use_solutions(solved)
    try:
        namespace: dict = {"__name__": f"lesson_{name[:2]}"}
        start = time.perf_counter()
        for cell in _section(name):
            exec(compile(cell.source, f"{name}:build", "exec"), namespace)
        return capsys.readouterr().out, time.perf_counter() - start
    finally:
        workshop.use_solutions(False)


@pytest.mark.parametrize("name", SECTIONS)
def test_the_build_section_runs_for_learners_and_instructors(name, capsys):
    cells = _section(name)
    stubs = [c for c in cells if "build" in c.metadata.get("tags", [])]
    assert len(stubs) == SECTIONS[name]
    for cell in stubs:
        assert "@exercise(" in cell.source and "raise NotImplementedError" in cell.source
        assert "try_exercise(" in cell.source
    learner, _ = _run_section(name, False, capsys)
    assert learner.count("not done yet — here is what the check expects") == SECTIONS[name]
    assert "not yet: write the exercise above first" in learner and "✗" not in learner
    instructor, seconds = _run_section(name, True, capsys)
    assert instructor.count(" passed: ") == SECTIONS[name] and "✗" not in instructor
    assert "not done yet" not in instructor and "the same function" in instructor
    assert "NOT the same" not in instructor
    # every build exercise runs inside the model: lesson 2's cell runs B.3's head and B.2's chunked form
    assert instructor.count(": the same function") == {"02_delta_rule.py": 2}.get(name, 1), instructor
    print(f"{name}: build section in instructor mode {seconds:.2f} s")     # (measured, not asserted)


def test_lesson3_counts_the_learners_cache_against_the_latent_cache(capsys, small64):
    out, _ = _run_section("03_memory_that_does_not_grow.py", True, capsys)
    c = small64.config
    from tiny_k3.tokenizer import encode

    tokens = len(encode(workshop_prompt()))
    yours = len(c.mla_layers) * tokens * c.mla_heads * (c.qk_nope_dim + c.qk_rope_dim + c.v_head_dim) * 8
    latent = len(c.mla_layers) * tokens * (c.kv_lora_rank + c.qk_rope_dim) * 8
    assert f"your KV caches hold {yours:,} B; the model's latent caches {latent:,} B" in out
    assert f"{yours / latent:.2f}x" in out and "the same logits from both caches" in out
