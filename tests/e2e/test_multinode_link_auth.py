"""End to end, two launches on loopback (a head with rank 0, a headless node with rank 1): with the same secret
(the head's from ``--data-parallel-secret-file``, the headless node's from ``ASYNCDP_DP_SECRET``) the deployment
serves on both ranks, a stranger on any TCP port of the head gets closed while it serves on, and no child
process holds the secret in its command line or environment; with different secrets the headless node exits 1
at once with one line saying the secrets do not match, and the head logs the refused link and waits on."""

from __future__ import annotations

import re
import signal
import subprocess
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, READY_TIMEOUT_S, free_port
from tests.e2e.link_auth import frames_in, listening_tcp_ports, poke, valid_looking_first_frame
from tests.e2e.multinode import Deployment, NodeSpec, _wait_logged, deployment, head, headless, launch_node

pytestmark = [pytest.mark.e2e]

SECRET = "c0ffee-5ecret-of-the-e2e-deployment"
LAYOUT = (head("-dp", "2", "-dpl", "1", "--api-server-count", "1"), headless("-dp", "2", "-dpl", "1", "-dpr", "1"))


def secret_file(tmp_path: Path, content: str) -> Path:
    path = tmp_path / f"dp-{uuid.uuid4().hex[:6]}.secret"
    path.write_text(content + "\n")
    path.chmod(0o600)
    return path


def with_file(spec: NodeSpec, path: Path) -> NodeSpec:
    return NodeSpec((*spec.args, "--data-parallel-secret-file", str(path)), http=spec.http, name=spec.name)


def completions_work(base_url: str, n: int) -> None:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        for _ in range(n):
            r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
            assert r.choices[0].finish_reason in ("length", "stop")


def child_pids(dep: Deployment) -> list[int]:
    dep.remember_trees()
    return [pid for n in dep.nodes for pid in n.known if pid != n.process.pid]


def test_nodes_with_the_same_secret_serve_and_a_stranger_on_the_heads_ports_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_DP_SECRET", SECRET)
    specs = (with_file(LAYOUT[0], secret_file(tmp_path, SECRET)), LAYOUT[1])
    with deployment(tmp_path, *specs) as dep:
        completions_work(dep.head.base_url, 2)
        ports = listening_tcp_ports([dep.head.process.pid, *dep.head.known]) - {dep.head.port}
        assert dep.rpc in ports and len(ports) >= 3, ports  # the rpc port, the coordinator's two, the client link
        for port in sorted(ports):
            answer, closed = poke(("127.0.0.1", port), valid_looking_first_frame("rpc" if port == dep.rpc else "x"))
            assert closed, f"port {port}: a stranger's link stayed open\n{dep.logs()}"
            (told,) = frames_in(answer)
            assert "ASYNCDP_DP_SECRET" in getattr(told, "reason", ""), (port, told)
        completions_work(dep.head.base_url, 4)
        info = httpx.get(f"{dep.head.base_url}/server_info", timeout=10).json()
        assert [r["state"] for r in info["managed_ranks"]] == ["ready", "ready"]
        for pid in child_pids(dep):  # the secret reached them in their role configs
            for what in ("cmdline", "environ"):
                try:
                    assert SECRET.encode() not in Path(f"/proc/{pid}/{what}").read_bytes(), (pid, what)
                except FileNotFoundError:  # it ended meanwhile
                    pass
        dep.stop()
    head_log = dep.head.log()
    refused = [line for line in head_log.splitlines() if "WARNING" in line and "refused a link from 127.0.0.1:" in line]
    assert len(refused) == len(ports), "\n".join(refused)
    assert all(SECRET not in n.log() for n in dep.nodes)
    assert not any("not authenticated" in n.log() for n in dep.nodes)


def test_a_headless_node_with_another_secret_exits_1_with_one_line_and_the_head_waits_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCDP_DP_SECRET", raising=False)
    rpc = free_port()
    head_node = launch_node(with_file(LAYOUT[0], secret_file(tmp_path, SECRET)), rpc, tmp_path / "head.log", MODEL)
    monkeypatch.setenv("ASYNCDP_DP_SECRET", "another secret")
    node = launch_node(LAYOUT[1], rpc, tmp_path / "headless.log", MODEL)
    dep = Deployment([head_node, node], list(LAYOUT), rpc, MODEL)
    try:
        try:
            code = node.process.wait(timeout=READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the headless node did not exit within {READY_TIMEOUT_S} s\n{dep.logs()}")
        assert code == 1, dep.logs()
        mismatch = [line for line in node.log().splitlines() if "secret" in line]
        assert len(mismatch) == 1, dep.logs()
        assert re.search(rf"ERROR .*startup failed: the head at tcp:127\.0\.0\.1:{rpc} holds another deployment "
                         r"secret: the secrets do not match; give every node the same ASYNCDP_DP_SECRET or "
                         r"--data-parallel-secret-file$", mismatch[0]), mismatch[0]
        assert "Traceback" not in node.log() and "EngineCore_DP" not in node.log()  # no engine was started
        # (the head is still up, waiting for its ranks: _wait_logged fails the test if it exits)
        _wait_logged(head_node, r"WARNING .*refused a link from 127\.0\.0\.1:\d+ to the handshake listener: it "
                                r"closed the link instead of proving it holds this deployment's secret", 10.0)
        head_node.process.send_signal(signal.SIGTERM)
        head_node.process.wait(timeout=30)
    finally:
        dep.kill_all()
    assert "another secret" not in head_node.log() + node.log() and SECRET not in head_node.log() + node.log()
