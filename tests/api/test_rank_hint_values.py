"""A rank hint of any JSON value that is not an integer is E1, a 400 whose message shows the value briefly:
arrays and objects by their kind (a repr of one nested ~990 deep recursed past the interpreter's limit, a 500),
long strings cut."""

from __future__ import annotations

import pytest

from asyncdp.dp.hints import parse_rank
from asyncdp.errors import InvalidRequestError
from tests.api.conftest import running


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["data_parallel_rank", "data_parallel_global_rank"])
@pytest.mark.parametrize("depth", [1, 980, 985, 990])
async def test_a_deeply_nested_rank_hint_is_e1_not_a_500(field: str, depth: int) -> None:
    body = f'{{"prompt": "hi", "max_tokens": 1, "{field}": {_nested(depth)}}}'.encode()
    async with running() as srv:
        r = await srv.http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if error["message"] == "The request body is nested too deeply.":  # the decoder's own limit (stack-dependent)
        assert depth >= 985
        return
    assert error["message"] == f"{field} must be an integer (got an array of {int(depth > 1)} item(s))."
    assert error["param"] == field


@pytest.mark.parametrize(("value", "shown"), [
    ({"a": [1]}, "an object with 1 key(s)"),
    ([1, 2, 3], "an array of 3 item(s)"),
    (1.5, "1.5"),
    (None, "None"),
    ("x" * 10_000, "'" + "x" * 59 + "..."),
    (b"1", "bytes"),
])
def test_a_bad_hint_is_shown_briefly(value: object, shown: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_rank(value)
    assert str(info.value) == f"data_parallel_rank must be an integer (got {shown})."
