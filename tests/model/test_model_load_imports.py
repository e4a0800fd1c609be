"""Loading a model imports no more of torch than the forward needs.

The model was built on the meta device, whose first use imports sympy and torch's symbolic shapes, and whose
random init of the embedding (normal_, no meta kernel of its own) went through torch._refs and imported
torch._dynamo, which left a ``torchinductor_<user>`` directory in TMPDIR: 1.3-1.7 s of every engine process's
startup for a 181k-parameter model here, now 0.1 s. Checked in a fresh interpreter, where nothing else imported
them first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_LOAD = """
import json, sys
from pathlib import Path
import torch
from asyncdp.model.loader import load_model
model = load_model(Path(sys.argv[1]), device=torch.device("cpu"), dtype=torch.float32)
print(json.dumps({"imported": sorted({"torch._dynamo", "sympy"} & set(sys.modules)),
                  "embedding_shape": list(model.model.embed_tokens.weight.shape)}))
"""


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_load_model_does_not_import_dynamo_or_leave_files(which: str, dense_path: Path, moe_path: Path,
                                                          tmp_path: Path) -> None:
    path = dense_path if which == "dense" else moe_path
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    config = json.loads((path / "config.json").read_text())
    assert result["embedding_shape"] == [config["vocab_size"], config["hidden_size"]]
    assert result["imported"] == []
    assert sorted(p.name for p in tmp.iterdir()) == []
