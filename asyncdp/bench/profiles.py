"""Cost profiles of the simulated cluster (spec routing-bench §5), by name or from a file.

A profile is the step-time model ``a + b·P + c·D + d·K (+ e·Σ p·(c0 + p/2))`` (ms) plus the rank's capacity: KV blocks (of 16
tokens), ``max_num_seqs`` and ``max_num_batched_tokens``. The named ones are the spec's placeholders
(uncalibrated, [ours]); a calibrated profile is a JSON object with the same keys (extra keys such as model,
device, dtype, fit R² are kept as metadata and ignored here). :func:`profile_hash` names the constants in
every report (C2).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any

from asyncdp.bench.records import MAX_KV_BLOCKS
from asyncdp.config.flags import SimCostProfile
from asyncdp.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    a_ms: float
    b_ms_per_token: float
    c_ms_per_seq: float
    d_ms_per_kv_token: float
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    e_ms_per_token_pair: float = 0.0  # prefill attention (§5's optional e term); 0 in the named profiles

    def cost(self) -> SimCostProfile:
        return SimCostProfile(a_ms=self.a_ms, b_ms_per_token=self.b_ms_per_token, c_ms_per_seq=self.c_ms_per_seq,
                              d_ms_per_kv_token=self.d_ms_per_kv_token, e_ms_per_token_pair=self.e_ms_per_token_pair)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("gpu_8b", 6.0, 0.040, 0.030, 4.0e-5, 28_000, 1024, 8192),
    Profile("gpu_1b", 3.0, 0.008, 0.010, 1.0e-5, 120_000, 1024, 8192),
    Profile("a100_8b", 9.0, 0.100, 0.060, 7.0e-5, 27_000, 256, 2048),
    Profile("h100x2_32b", 11.0, 0.070, 0.060, 4.0e-5, 19_208, 1024, 8192),
    Profile("moe_a3b", 8.0, 0.020, 0.040, 3.0e-5, 40_000, 1024, 8192),
)}
DEFAULT_PROFILE = "gpu_8b"
_FIELDS = ("a_ms", "b_ms_per_token", "c_ms_per_seq", "d_ms_per_kv_token", "kv_blocks", "max_num_seqs",
           "max_num_batched_tokens")
_LEAST = (2, 1, 1)  # kv_blocks, max_num_seqs, max_num_batched_tokens: what the engine's configuration allows


def load_profile(name_or_file: str) -> Profile:
    """A named profile, or a JSON profile file (a calibrated one)."""
    if name_or_file in PROFILES:
        return PROFILES[name_or_file]
    path = Path(name_or_file)
    if not path.is_file():
        raise ConfigError(f"unknown cost profile {name_or_file!r}: not one of {', '.join(PROFILES)} "
                          "and not a profile file.")
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read cost profile file {path}: {exc}.") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a cost profile file holds one JSON object.")
    missing = [k for k in _FIELDS if k not in data]
    if missing:
        raise ConfigError(f"{path}: cost profile lacks {', '.join(missing)}.")
    a, b, c, d, e = (_coefficient(path, data, k, 0.0 if k == "e_ms_per_token_pair" else None)
                     for k in (*_FIELDS[:4], "e_ms_per_token_pair"))
    blocks, seqs, batched = (_capacity(path, data, k, least) for k, least in zip(_FIELDS[4:], _LEAST, strict=True))
    return Profile(str(data.get("name", path.stem)), a, b, c, d, blocks, seqs, batched, e)


def _coefficient(path: Path, data: dict[str, Any], key: str, default: float | None) -> float:
    """A step-time coefficient: a finite number >= 0 (NaN or infinity made every simulated step fail)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}: cost profile field {key!r} must be a number of milliseconds, got {value!r}.")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{path}: cost profile field {key!r} must be a finite number >= 0, got {value!r}.")
    return float(value)


def _capacity(path: Path, data: dict[str, Any], key: str, least: int) -> int:
    """A rank's capacity: a whole number >= ``least`` (checked here, naming the field, not by the engine at the
    first run, naming a flag the user never gave); ``kv_blocks`` at most :data:`MAX_KV_BLOCKS`."""
    value = data[key]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        why = " (block 0 is the engine's scratch block)" if key == "kv_blocks" else ""
        raise ConfigError(f"{path}: cost profile field {key!r} must be an integer >= {least}{why}, got {value!r}.")
    if key == "kv_blocks" and value > MAX_KV_BLOCKS:  # (10**13 was a MemoryError traceback at the first run)
        raise ConfigError(f"{path}: cost profile field 'kv_blocks' must be at most {MAX_KV_BLOCKS} (about 650 MB "
                          f"of simulator memory per rank), got {value}.")
    return value


def profile_hash(profile: Profile) -> str:
    """BLAKE2b-64 (hex) of the profile's constants, name excluded."""
    fields = asdict(profile)
    del fields["name"]
    if not fields["e_ms_per_token_pair"]:
        del fields["e_ms_per_token_pair"]  # a profile without e keeps the hash it had before e existed
    return blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=8).hexdigest()
