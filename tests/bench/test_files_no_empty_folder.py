"""The output checks before a run create nothing: a run that fails or is interrupted after them left the folders of
``--json``/``--plots`` behind, empty. :func:`write` makes a missing folder when it writes."""

from __future__ import annotations

import pytest

from asyncdp.bench.files import check_file, check_folder, write
from asyncdp.errors import ConfigError


def test_the_checks_make_no_folder_and_write_makes_it(tmp_path):
    json_path = check_file("--json", str(tmp_path / "a" / "b" / "out.json"))
    plots = check_folder("--plots", str(tmp_path / "plots" / "run1"))
    assert list(tmp_path.iterdir()) == []  # nothing left by the checks, not even a probe file
    write("--json", json_path, "{}")
    assert json_path.read_text() == "{}"
    write("--plots", plots / "cdf.png", b"png")
    assert (plots / "cdf.png").read_bytes() == b"png"


def test_a_folder_that_cannot_be_made_is_still_refused_before_the_run(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_file("--json", str(tmp_path / "file" / "sub" / "out.json"))
    with pytest.raises(ConfigError, match="cannot create the folder"):  # (/proc takes no file, even from root)
        check_folder("--plots", "/proc/asyncdp-no-such-folder/plots")
