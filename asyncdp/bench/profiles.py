"""Cost profiles of the simulated cluster (spec routing-bench §5), by name or from a file.

A profile is the step-time model ``a + b·P + c·D + d·K (+ e·Σ p·(c0 + p/2))`` (ms) plus the rank's capacity: KV blocks (of 16
tokens), ``max_num_seqs`` and ``max_num_batched_tokens``. The named ones are the spec's placeholders
(uncalibrated, [ours]); a calibrated profile is a JSON object with the same keys (extra keys such as model,
device, dtype, fit R² are kept as metadata and ignored here). :func:`profile_hash` names the constants in
every report (C2).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any

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
    try:
        a, b, c, d = (float(data[k]) for k in _FIELDS[:4])
        blocks, seqs, batched = (int(data[k]) for k in _FIELDS[4:])
        e = float(data.get("e_ms_per_token_pair", 0.0))
        if min(a, b, c, d, e) < 0:
            raise ValueError("a cost coefficient is negative")
        return Profile(str(data.get("name", path.stem)), a, b, c, d, blocks, seqs, batched, e)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: bad cost profile value ({exc}).") from exc


def profile_hash(profile: Profile) -> str:
    """BLAKE2b-64 (hex) of the profile's constants, name excluded."""
    fields = asdict(profile)
    del fields["name"]
    if not fields["e_ms_per_token_pair"]:
        del fields["e_ms_per_token_pair"]  # a profile without e keeps the hash it had before e existed
    return blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=8).hexdigest()
