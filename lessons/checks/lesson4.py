"""Lesson 4 checks: one depth-attention read, the sources of Block AttnRes."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

@register("4.1", "depth_attention", difficulty=2, minutes=12, expects="""
my_depth_attention(sources, query, norm_weight) -> (h, weights)       one token (attnres.md §2)
  sources [N, D]: v_0 = the embedding, then earlier sublayer outputs (or block sums); query [D]: w_l;
  norm_weight [D]: the gain of the key norm; use eps = 1e-6
  returns h [D], what the sublayer reads, and weights [N], one per source, summing to 1.
Checked against tiny_k3.attnres.depth_attention.
""",
          hints=('Keys are the sources through an RMSNorm (with its gain); the logits are key · query with no 1/√D; '
                 'the softmax runs over the N sources; h mixes the RAW sources.',
                 'sources [N, D]. Keys: each row divided by its root-mean-square over the D channels (eps 1e-6 '
                 'inside the root), times the gain norm_weight [D] → keys [N, D]. Logits: each key dotted with '
                 'query [D] → [N], with no 1/√D. Softmax over the N logits → weights [N]. h: the weighted sum of '
                 'the RAW source rows → [D].',
                 'keys = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight\n'
                 '  weights = (keys @ query).softmax(0);  return weights @ sources, weights'))
def check_depth_attention(fn) -> None:
    from tiny_k3.attnres import depth_attention
    from tiny_k3.norm import rms_norm

    gen = torch.Generator().manual_seed(5)
    for N, D in [(2, 8), (5, 16), (9, 32)]:
        scales = torch.logspace(-3, 1, N, dtype=torch.float64)[:, None]  # very different sizes; the quietest
        # (RMS 1e-3, mean square = eps) tells an RMSNorm with eps from an L2 norm scaled by √D
        sources = torch.randn(N, D, generator=gen, dtype=torch.float64) * scales
        query = torch.randn(D, generator=gen, dtype=torch.float64)
        gain = torch.rand(D, generator=gen, dtype=torch.float64) + 0.5
        h_ref, w_ref = depth_attention(sources[:, None, None], query, gain, eps=1e-6)
        h_ref, w_ref = h_ref.view(D), w_ref.view(N)
        got = _call(fn, (sources.clone(), query.clone(), gain.clone()),
                    f"sources [{N}, {D}], query [{D}], norm_weight [{D}]",
                    "normalise over the last dim (D); the softmax runs over the N sources (dim 0).")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two things: (h [D], weights [N]).")
        h = _tensor(got[0], "h", (D,), "one vector of the model width D")
        w = _tensor(got[1], "weights", (N,), f"one weight per source, N = {N}")
        if _close(h, h_ref, atol=1e-5) and _close(w, w_ref, atol=1e-5):
            continue
        keys = rms_norm(sources, gain, 1e-6)
        l2_keys = torch.nn.functional.normalize(sources, dim=-1)
        l2_message = (f"You L2-normalised the keys (x / ‖x‖, as KDA does to q and k). AttnRes uses an RMSNorm, "
                      f"x / sqrt(mean(x²) + eps): that is √D = {D ** 0.5:.2f} times larger, so your logits are "
                      f"√D times too small and the softmax over depth too flat. RMSNorm keeps a logit's size "
                      f"independent of the width, which is why AttnRes needs no 1/√d (attnres.md §2).")
        right = f"For this input the weights are {_fmt(w_ref)}; yours are {_fmt(w)}."
        if not _close(w, w_ref, atol=1e-5):
            if abs(float(w.sum()) - 1) > 1e-4:
                raise ExerciseError(f"Your weights sum to {float(w.sum()):.4f}: the softmax must run over the N "
                                    "sources (depth), one weight per source. " + right)
            if _close(w, torch.full((N,), 1 / N, dtype=torch.float64)):
                raise ExerciseError("Uniform weights are what a zero query gives. Use the query: logit_i = "
                                    "query · RMSNorm(source_i). " + right)
            for label, logits in [
                ("You divided the logits by sqrt(D). AttnRes has no 1/√d on depth logits (attnres.md §2, §9): "
                 "the keys are RMS-normalised already.", keys @ query / D ** 0.5),
                ("You did not normalise the keys. Keys are RMSNorm(source)·norm_weight, so a loud source does not "
                 "win just by being loud.", sources @ query),
                ("You forgot the key-norm gain: keys = RMSNorm(source) · norm_weight.",
                 rms_norm(sources, None, 1e-6) @ query),
                (l2_message, l2_keys * gain @ query),
                (l2_message, l2_keys @ query),
            ]:
                if _close(w, logits.softmax(0), atol=1e-5):
                    raise ExerciseError(label + " " + right)
            raise ExerciseError(right)
        right_h = f"h[:4] should be {_fmt(h_ref[:4])}; yours is {_fmt(h[:4])}."
        if _close(h, w_ref @ keys, atol=1e-5) or _close(h, w_ref @ rms_norm(sources, None, 1e-6), atol=1e-5):
            raise ExerciseError("The weights are right, but you summed the normalised keys. Only the keys are "
                                "normalised; h mixes the raw sources: h = Σ w_i · source_i. " + right_h)
        if _close(h, sources.sum(0), atol=1e-5):
            raise ExerciseError("That is the standard residual (an unweighted sum). Mix with the weights. " + right_h)
        raise ExerciseError("The weights are right but h is not. " + right_h)
    _passed("check_depth_attention", "RMS-normed keys, no 1/√d, softmax over depth, raw values — as "
                                     "tiny_k3.attnres.depth_attention.")


@register("4.2", "block_sources", difficulty=3, minutes=12, expects="""
my_block_sources(embedding, outputs, block_size) -> list of tensors   (Block AttnRes, attnres.md §2)
  embedding [D]; outputs: the sublayer outputs v_1 .. v_n produced so far (a list of [D]);
  block_size S: sublayers per block.
  returns what the NEXT sublayer attends over, in order, embedding first.
Checked against tiny_k3.attnres.DepthStream.
""",
          hints=('b_0 is the embedding alone; each completed block of S outputs becomes ONE source (its own sum); a '
                 'started block adds its partial sum.',
                 'Walk outputs in slices of S neighbours: outputs 0 … S−1, then S … 2S−1, and so on; the last slice '
                 'may be shorter (the block in progress). Each slice becomes one tensor, the sum of its members '
                 '(shape of the embedding). The list is the embedding followed by one sum per slice: 1 + '
                 '⌈(number of outputs) / S⌉ sources.',
                 'sources = [embedding]\n'
                 '  for start in range(0, len(outputs), block_size):\n'
                 '      sources.append(sum(outputs[start:start + block_size], torch.zeros_like(embedding)))'))
def check_block_sources(fn) -> None:
    from tiny_k3.attnres import DepthStream

    gen = torch.Generator().manual_seed(6)
    D = 4
    for S in [2, 3, 4]:
        for n in range(0, 8):
            emb = torch.randn(D, generator=gen, dtype=torch.float64)
            outs = [torch.randn(D, generator=gen, dtype=torch.float64) for _ in range(n)]
            stream = DepthStream(emb, "block", S)
            for v in outs:
                stream.add(v)
            want = stream.sources()
            got = _call(fn, (emb.clone(), [v.clone() for v in outs], S),
                        f"embedding [{D}], {n} outputs, block_size={S}")
            if not isinstance(got, (list, tuple)):
                raise ExerciseError("Return a list of [D] tensors (the sources, embedding first).")
            got = [_tensor(x, f"source {i}", (D,), "each source is a vector of width D") for i, x in enumerate(got)]
            completed, partial = n // S, n % S
            layout = (f"after {n} outputs with block_size {S}: the embedding, {completed} completed block sum(s)"
                      + (f" and a partial sum of the last {partial} output(s)" if partial else " and no partial sum"))
            if len(got) != len(want):
                if len(got) == n + 1:
                    raise ExerciseError(f"You returned one source per output: that is Full AttnRes (block_size 1). "
                                        f"Block AttnRes sums each block of {S} outputs into one source; {layout} "
                                        f"= {len(want)} sources.")
                raise ExerciseError(f"Expected {len(want)} sources, got {len(got)}: {layout}.")
            for i, (a, b) in enumerate(zip(got, want)):
                if _close(a, b, atol=1e-9):
                    continue
                what = "b_0 (the embedding)" if i == 0 else ("the partial sum" if partial and i == len(want) - 1
                                                              else f"block sum b_{i}")
                zero = torch.zeros(D, dtype=torch.float64)
                upto = sum(outs[: min(i * S, n)], zero)  # everything from the start up to this source
                hint = ""
                if i > 0 and _close(a, b + emb, atol=1e-9):
                    hint = " It includes the embedding: block sums hold sublayer outputs only; the embedding is b_0, alone."
                elif i > 1 and (_close(a, upto, atol=1e-9) or _close(a, upto + emb, atol=1e-9)):
                    hint = " It is a running total from the start; each b_n sums only its own block's outputs."
                raise ExerciseError(f"Source {i} ({what}) is wrong, {layout}.{hint}\n"
                                    f"  It should be {_fmt(b)}; yours is {_fmt(a)}.")
    _passed("check_block_sources", "embedding, completed block sums and the partial sum — as "
                                   "tiny_k3.attnres.DepthStream for block sizes 2, 3 and 4.")
