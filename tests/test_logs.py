"""The startup and shutdown lines' content (asyncdp.logs) and Hypercorn's logger (asyncdp.api.serve)."""

from __future__ import annotations

import logging

import pytest

from asyncdp.api.serve import http_logger
from asyncdp.logs import (
    DrainCounts,
    human_bytes,
    human_count,
    kv_cache_line,
    serving_line,
    stopped_line,
    weights_line,
)


def test_stopped_line_sums_drained_and_aborted_over_every_api_server() -> None:
    line = stopped_line([DrainCounts(drained=2, aborted=1), DrainCounts(drained=1, aborted=0)], exit_status=0)
    assert line == "stopped: 3 requests drained, 1 aborted; exit status 0"


def test_stopped_line_with_one_request_uses_the_singular() -> None:
    assert stopped_line([DrainCounts(drained=1)], exit_status=0) == "stopped: 1 request drained, 0 aborted; " \
                                                                     "exit status 0"


def test_stopped_line_names_api_servers_that_did_not_report_and_a_failed_exit() -> None:
    line = stopped_line([DrainCounts(drained=4)], exit_status=1, unreported=1)
    assert line == ("stopped after a failure: 4 requests drained, 0 aborted (1 API server did not report); "
                    "exit status 1")


def test_serving_line_names_model_bound_address_ranks_and_api_servers() -> None:
    line = serving_line(model="builtin:tiny-dense", model_path=None, scheme="http", host="127.0.0.1", port=43121,
                        dp_size=2, api_server_count=2, took_s=3.04)
    assert line == ("serving builtin:tiny-dense on http://127.0.0.1:43121 with 2 ranks (2 API servers); "
                    "startup took 3.0 s")


def test_serving_line_brackets_an_ipv6_host_and_shows_the_checkpoint_behind_a_served_name() -> None:
    line = serving_line(model="mine", model_path="/ckpt/llama", scheme="https", host="::1", port=8000, dp_size=1,
                        api_server_count=1, took_s=1.0)
    assert line.startswith("serving mine (/ckpt/llama) on https://[::1]:8000 with 1 rank (1 API server);")


def test_serving_line_of_a_hybrid_node_names_its_own_ranks_among_the_deployments() -> None:
    line = serving_line(model="m", model_path=None, scheme="http", host="127.0.0.1", port=8001, dp_size=4,
                        api_server_count=2, took_s=1.0, managed="ranks 2..3")
    assert "with ranks 2..3 of 4 ranks (2 API servers)" in line


def test_kv_cache_line_leaves_out_the_scratch_block() -> None:
    line = kv_cache_line(1, num_blocks=8193, block_size=16, num_bytes=128 * 2**20)
    assert line == "rank 1: KV cache of 8192 blocks x 16 tokens = 131072 tokens (128.0 MiB)"


def test_weights_line_of_a_torch_rank_and_of_a_simulated_one() -> None:
    assert weights_line(0, num_parameters=134_515_008, dtype="bfloat16", device="cuda:0", took_s=1.234) == \
        "rank 0: weights loaded in 1.23 s: 135M parameters, bfloat16 on cuda:0"
    assert weights_line(1, num_parameters=None, dtype=None, device=None, took_s=0.5) == \
        "rank 1: simulated executor ready in 0.50 s (no weights)"


@pytest.mark.parametrize(("n", "text"), [(999, "999"), (181_248, "181k"), (1_500_000_000, "1.5B")])
def test_human_count(n: int, text: str) -> None:
    assert human_count(n) == text


def test_human_bytes() -> None:
    assert (human_bytes(512), human_bytes(1536), human_bytes(3 * 2**30)) == ("512 B", "1.5 KiB", "3.0 GiB")


def test_hypercorn_running_on_line_is_dropped_at_info_and_other_lines_pass(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncdp.http")
    logger = http_logger()
    assert logger.name == "asyncdp.http"
    logger.info("Running on http://fd://7 (CTRL + C to quit)")
    logger.warning("Invalid HTTP request received.")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("asyncdp.http", "WARNING", "Invalid HTTP request received.")]


def test_hypercorn_running_on_line_is_kept_as_debug_when_debug_is_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncdp.http")
    http_logger().info("Running on http://127.0.0.1:8000 (CTRL + C to quit)")
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
