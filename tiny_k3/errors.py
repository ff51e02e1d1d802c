"""The errors tiny_k3 raises about configurations (a module of its own so every other module can import it)."""


class ConfigError(ValueError):
    """A config that cannot build a model; the message is one sentence saying why."""
