"""dev.py's test command: the suite, then (whole-suite runs only) the fast-path tests on other BLAS kernels."""

from __future__ import annotations

import dev


def test_the_whole_suite_also_runs_the_fast_path_tests_on_mkl_avx2_kernels():
    (suite, suite_env), (fast, fast_env) = dev.test_commands([])
    assert suite[1:] == ["-m", "pytest", "-q"] and suite_env == {}
    assert fast_env == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert fast[fast.index("-k") + 1] == "threads1 or threads2"            # the tests that run at 1 and 2 threads
    for path in dev.FAST_PATH_TESTS:
        assert path in fast and "torch_threads" in (dev.ROOT / path).read_text(), path


def test_a_run_with_pytest_arguments_is_only_that_run():
    ((argv, env),) = dev.test_commands(["-x", "tests/test_moe.py"])
    assert argv[-2:] == ["-x", "tests/test_moe.py"] and env == {}
