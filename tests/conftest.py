import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Two cores: keep torch from oversubscribing them when pytest runs things side by side.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
