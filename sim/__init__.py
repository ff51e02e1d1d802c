"""sim: the step-through simulator that drives tiny_k3 and scales its figures up to K3."""
