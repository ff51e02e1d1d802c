import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The tests run many tiny ops: one thread avoids synchronisation stalls (and CI has two cores).
TEST_THREADS = 1
torch.set_num_threads(TEST_THREADS)


@pytest.fixture(params=[1, 2], ids=["threads1", "threads2"])
def torch_threads(request):
    """Runs a test with torch at 1 and at 2 intra-op threads (a module opts in with
    `pytestmark = pytest.mark.usefixtures("torch_threads")`: the fast-path tests, issue 24).

    The thread count changes which BLAS kernel runs and how parallel reductions split their sums, so a test
    that passes at both has seen both roundings. torch.set_num_threads sets OpenMP's and MKL's counts for the
    calls that follow, as OMP_NUM_THREADS does at start-up, inside this one pytest process: no second
    interpreter, import and collection per thread count, and a plain `pytest tests/test_moe.py` runs both."""
    torch.set_num_threads(request.param)
    assert torch.get_num_threads() == request.param
    yield request.param
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def compiling():
    """The compiled path's switch on for one test (TINY_K3_COMPILE=1), as it was afterwards."""
    from tiny_k3 import compiled

    before = compiled.enabled()
    compiled.enable(True)
    yield
    compiled.enable(before)


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    """A fresh folder for the C kernels' builds (tiny_k3/native.py), and nothing remembered from earlier builds in
    this process."""
    from tiny_k3 import native

    monkeypatch.setenv("TINY_K3_NATIVE_DIR", str(tmp_path))
    native._library.cache_clear()
    yield tmp_path
    native._library.cache_clear()
