"""Every workload option a generator accepts changes the workload; one that does nothing with the scale, preset or
arrival given (W2's ``stages`` at quick scale, its ``requests_per_rung`` at full scale, ``rate_rps`` without
``arrival=poisson``, ...) is an error naming the option, the workload, the scale and the options that apply,
never a knob silently ignored; and no value of an option is a traceback."""

from __future__ import annotations

import msgspec
import pytest

from asyncdp.bench.workloads import build
from asyncdp.cli import main
from asyncdp.errors import ConfigError

#: (workload spec, scale, extra options): every generator, every preset, each arrival mode once, both W2 scales
CASES = [
    ("w1", "quick", {}), ("w1", "quick", {"arrival": "poisson"}), ("w1", "quick", {"arrival": "ladder"}),
    ("w1", "full", {}), ("w2", "quick", {}), ("w2", "full", {}), ("w3", "quick", {}),
    ("w3", "quick", {"arrival": "poisson"}), ("w3@ray_scaling", "quick", {}), ("w4", "quick", {}),
    ("w4@pressure", "quick", {}), ("w5", "quick", {}), ("w6", "quick", {}), ("w6", "quick", {"arrival": "poisson"}),
    ("w7", "quick", {}), ("w7", "quick", {"arrival": "poisson"}), ("w8", "quick", {}), ("w8@pure_long", "quick", {}),
    ("w8@32k_in_1_out", "quick", {}), ("w9", "quick", {}), ("w9@onoff", "quick", {}), ("w10", "quick", {}),
    ("w10@conversation", "quick", {}),
]
CHOICES = {"arrival": ("burst", "poisson", "ladder"), "working_set": ("0.73", "0.37"), "order": ("random", "fifo"),
           "process": ("poisson", "uniform"), "replay": ("sessions", "schedule")}


def _alternatives(name, value):
    """Other values of an option, to try until one is accepted."""
    if name in CHOICES:
        return [c for c in CHOICES[name] if c != value]
    if isinstance(value, bool):
        return [not value]
    if value is None:  # (w1's zipf_alpha)
        return [1.0]
    if isinstance(value, list):  # (w2's stages)
        return [value[:2]]
    if isinstance(value, int):
        return [value * 2 + 1, value // 2]
    return [value * 2, value / 2, 1.0, 0.5]


def _shape(workload):
    """Everything of a workload but its header's option values."""
    return msgspec.structs.replace(workload, options={})


@pytest.mark.parametrize(("spec", "scale", "extra"), CASES)
def test_every_option_a_workload_accepts_changes_it(spec, scale, extra):
    base = build(spec, scale, 1, extra)
    for name, value in base.options.items():
        if name == "preset" or name in extra:
            continue
        changed = False
        for other in _alternatives(name, value):
            try:
                varied = build(spec, scale, 1, {**extra, name: other})
            except ConfigError:
                continue
            if _shape(varied) != _shape(base):
                changed = True
                break
        assert changed, f"{spec} at {scale} {extra}: option {name} is accepted but changes nothing"


@pytest.mark.parametrize(("spec", "scale", "options", "names"), [
    ("w2", "quick", {"stages": "3,10"}, "option stages"),
    ("w2", "quick", {"stage_s": "5"}, "option stage_s"),  # was silently ignored
    ("w2", "full", {"requests_per_rung": "10"}, "option requests_per_rung"),  # was silently ignored
    ("w2", "quick", {"groups": "4", "working_set": "0.37"}, "option working_set"),  # groups won, silently
    ("w1", "quick", {"rate_rps": "4"}, "option rate_rps"),  # burst: no rate
    ("w6", "quick", {"rate_rps": "4"}, "option rate_rps"),  # a ladder: no rate of its own
    ("w7", "quick", {"arrival": "burst", "rate_rps": "4"}, "option rate_rps"),
    ("w3@ray_scaling", "quick", {"rate_rps": "4"}, "option rate_rps"),
    ("w8@pure_long", "quick", {"long_fraction": "0.5"}, "option long_fraction"),
    ("w8@32k_in_1_out", "quick", {"long_fraction": "0.5"}, "option long_fraction"),
    ("w9@onoff", "quick", {"clients": "8"}, "option clients"),  # onoff is open loop
    ("w9@onoff", "quick", {"requests_per_client": "8"}, "option requests_per_client"),
    ("w9", "quick", {"burst_size": "8"}, "option burst_size"),
])
def test_an_option_that_does_nothing_here_is_an_error_naming_it_the_workload_the_scale_and_what_applies(
        spec, scale, options, names):
    with pytest.raises(ConfigError) as info:
        build(spec, scale, 1, options)
    message = str(info.value)
    workload = spec.partition("@")[0]
    assert message.startswith(f"{workload} at --scale {scale}: {names} does nothing here: "), message
    takes = message.split(f"{workload} takes here: ")[1].rstrip(".").split(", ")
    name = names.removeprefix("option ")
    applies = build(spec, scale, 1, {k: v for k, v in options.items() if k != name}).options
    assert takes == sorted(applies)  # the options that do apply, by name
    assert "\n" not in message


def test_a_typo_names_the_scale_and_the_options_that_apply():
    with pytest.raises(ConfigError, match=r"^w5 at --scale full: unknown option user; w5 takes here: answer_len, dp, "):
        build("w5", "full", 1, {"user": "3"})


@pytest.mark.parametrize(("spec", "options", "message"), [
    ("w2", {"groups": "0"}, "groups='0' must be >= 1"),  # was a ValueError traceback (randrange of 0)
    ("w3", {"num_prefixes": "0"}, "num_prefixes='0' must be >= 1"),  # ZeroDivisionError
    ("w4", {"max_parallel": "0"}, "max_parallel='0' must be >= 1"),  # an AssertionError in the run
    ("w4", {"think_s": "nan"}, "think_s='nan' must be a finite number"),
    ("w5", {"qps": "0"}, "qps='0' must be > 0"),  # ZeroDivisionError
    ("w7", {"rho": "inf"}, "rho='inf' must be a finite number"),  # OverflowError
    ("w7", {"rho": "1000000000"}, "documents; at most 1,000,000"),  # ran for minutes
    ("w7", {"kv_blocks_per_rank": "10000000000000"}, "must be <= 4194304"),  # a MemoryError in the run
    ("w8", {"rate_fraction": "0"}, "rate_fraction='0' must be > 0"),  # ZeroDivisionError
    ("w8", {"long_fraction": "2"}, "long_fraction='2' must be <= 1"),  # ValueError: sample larger than population
    ("w8@pure_long", {"long_len": "500"}, "long_len='500' must be >= 1000"),  # randint(1000, 500)
    ("w9", {"length": "0"}, "length='0' must be >= 1"),  # ZeroDivisionError
    ("w9", {"duration_s": "1e12"}, "duration_s='1e12' must be <= 172800"),  # billions of requests
    ("w9", {"requests_per_client": "1000000"}, "would make 64,000,000 requests; the generators make at most"),
    ("w10", {"agents": "0"}, "agents='0' must be >= 1"),  # IndexError
    ("w10", {"delta_blocks_max": "2"}, "delta_blocks_max='2' must be >= 4"),  # randint(4, 2)
    ("w10", {"delta_blocks_max": "100000000"}, "delta_blocks_max='100000000' must be <= 128"),  # ran for minutes
    ("w10", {"rate_rps": "0"}, "rate_rps='0' must be > 0"),  # ZeroDivisionError
    ("w1", {"arrival": "poisson", "rate_rps": "1e-320"}, "rate_rps='1e-320' is too small"),  # OverflowError
    ("w1", {"range_ratio": "nan"}, "range_ratio='nan' must be a finite number"),
    ("w2", {"scale": "full", "stages": "10,inf"}, "stages='10,inf' is not a valid"),
])
def test_an_out_of_range_option_is_a_clear_error_not_a_traceback(spec, options, message):
    scale = options.pop("scale", "quick")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(spec, scale, 1, options)


def test_the_cli_refuses_w2s_stage_options_at_quick_scale_in_one_line_before_any_run(capsys):
    assert main(["bench", "routing", "--workload", "w2", "--option", "stage_s=5", "--policies", "vllm",
                 "--jobs", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("asyncdp: error: w2 at --scale quick: option stage_s does nothing here: ")
    assert captured.err.count("\n") == 1 and not captured.out  # refused before the R_sat measurement and the runs


def test_an_option_refused_for_the_second_workload_stops_the_command_before_the_first_workloads_runs(capsys):
    # the workloads were built one at a time, so w6's R_sat was measured (a run) before w2 was refused
    assert main(["bench", "routing", "--workload", "w6,w2", "--option", "num_requests=20", "--policies", "vllm",
                 "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncdp: error: w2 at --scale quick: unknown option num_requests") and "R_sat" not in err
