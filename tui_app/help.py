"""The help text (`?`): the keys and what each panel shows."""

HELP = """\
[b]tiny-k3[/b]: a Kimi K3-style model, one token and one layer at a time.

[b]Keys[/b]
  n / →      next token (computed ahead, so it is instant)     b / ←   back one token
  r          run / pause (it pauses once where the memory lines cross)
  i / o      step into / out of the token's layers             j / k   next / previous layer (inside: sublayer)
  h / H      next / previous KDA head                          c       compare with the all-softmax twin
  tab, 1-4   focus a panel (small terminals: show it)          z       zoom the focused panel / restore
  e          edit the prompt                                   p       switch preset
  s          save the run (reopen: tiny-k3 --open FILE)        escape  cancel a load
  ctrl+p     command palette: go to layer / expert / step      ?       this help         q   quit
  x          what if …: change the model at this token for the focused panel (ablate an expert, reset a
             KDA state, uniform depth weights, a shorter MLA context) and compare; n / b walk the steps,
             escape returns to the timeline, untouched (while it computes, escape cancels it)

[b]Panels[/b]
  Routing    all E experts of the selected MoE layer; the k chosen are lit, the rest shaded by score.
             Only k of E experts run per token: total parameters set the memory bill, active ones the compute.
  State      a KDA head's K x V memory S after this token, its per-channel decay alpha and write strength beta,
             and the delta-rule correction this token wrote. Its size never grows.
  Memory     measured cache bytes of this hybrid vs the same model with every layer softmax (MLA): the
             hybrid starts larger (its fixed KDA states) and the twin overtakes it; then K3 now and at 1M.
  Depth      Attention Residuals: each sublayer (row) reads a softmax mix of the earlier blocks (columns:
             emb, b1, b2, ..., partial), not a fixed sum.

At a recall query ("| z=" after "z=1;"), State names the KDA head whose read S^T q best matches the write made
at the definition, and Depth marks the 3 sublayers that pushed the answer's logit most (share of its margin).

Escape or ? closes this help."""
