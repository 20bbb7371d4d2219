import os
import sys

import numpy as np
import paddle
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _fp32_and_seeded():
    paddle.set_default_dtype("float32")
    paddle.seed(1234)
    np.random.seed(1234)
    yield
    paddle.set_default_dtype("float32")
