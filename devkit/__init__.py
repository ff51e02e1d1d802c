"""dev.py's set-up kit, by purpose: where the project's files and .venv are (paths), torch from PyTorch's CPU
index (torch_index), the workshop's wheelhouse and offline set-up (wheelhouse), a learner's copy (bundle).

Standard library only: `python3 dev.py ...` imports it with the system Python, before .venv exists."""
