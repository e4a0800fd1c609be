"""Rank hints at the LoadBalancer façade (dp-deployment §7.6, E1-E3): the hybrid local index and the global
form, the spec's messages for a bad hint, conflicting forms, and header strings."""

from __future__ import annotations

import pytest

from asyncdp.dp.balance import LoadBalancer, parse_rank
from asyncdp.errors import InvalidRequestError


def test_hybrid_hint_is_local_index_and_global_form_is_translated():
    lb = LoadBalancer([4, 5, 6, 7])
    assert lb.select("a", rank_hint=1) == 5
    assert lb.select("b", global_rank_hint="7") == 7
    assert lb.select("c", rank_hint="2", global_rank_hint=6) == 6


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank_hint": "x"}, "data_parallel_rank must be an integer (got 'x')."),
    ({"rank_hint": 1.5}, "data_parallel_rank must be an integer (got 1.5)."),
    ({"rank_hint": True}, "data_parallel_rank must be an integer (got True)."),
    ({"rank_hint": 4}, "data_parallel_rank 4 is out of range [0, 4)."),
    ({"rank_hint": -1}, "data_parallel_rank -1 is out of range [0, 4)."),
    ({"global_rank_hint": 2}, "data_parallel_global_rank 2 is not served by this endpoint (ranks 4..7)."),
])
def test_bad_hints_raise_spec_messages(kwargs, message):
    lb = LoadBalancer([4, 5, 6, 7])
    with pytest.raises(InvalidRequestError) as err:
        lb.select("a", **kwargs)
    assert str(err.value) == message
    assert lb.num_inflight == 0


def test_conflicting_hint_forms_are_rejected():
    lb = LoadBalancer([4, 5])
    with pytest.raises(InvalidRequestError, match="name different ranks"):
        lb.select("a", rank_hint=0, global_rank_hint=5)


def test_parse_rank_hint_accepts_header_strings():
    assert parse_rank(" 3 ") == 3
    assert parse_rank(-2) == -2
