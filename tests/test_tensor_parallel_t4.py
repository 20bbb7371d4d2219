"""Tensor parallelism at t = 4 (4 gloo ranks; H_kv = 2: KV heads replicated): the checks of
tests/test_tensor_parallel.py on the same cases, from one launch. In a file of its own so that the suite's two
workers (--dist loadfile: a file is the unit of scheduling) run the t = 2 and t = 4 launches at the same time.
"""
import pytest

import test_tensor_parallel as tp


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    return tp.run_cases(4, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.multirank
def test_tp_equals_single_device(tp_run):
    n, _, cases, results = tp_run
    tp.check_tp_results(n, cases, results)


@pytest.mark.slow
@pytest.mark.multirank
def test_tp_sharded_save_merge_fold(tp_run):
    tp.check_sharded_save_merge_fold(tp_run)
