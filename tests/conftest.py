import os

import pytest

# Every torch-using test runs single-threaded: two cores are shared by every process of the suite.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param
