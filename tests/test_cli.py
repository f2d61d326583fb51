"""The `streamgnn` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str, cwd) -> str:
    out = subprocess.run([sys.executable, "-m", "streamgnn.cli", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_help_explains_the_commands(tmp_path):
    text = run("--help", cwd=tmp_path)
    for word in ("train", "bootstrap", "demo", "datasets"):
        assert word in text


def test_train_then_bootstrap(tmp_path):
    text = run("train", "--dataset", "tiny", "--model", "gcn", "--epochs", "3", "--hidden",
               "8", "--out", "m.pt", cwd=tmp_path)
    assert "MLP" in text and (tmp_path / "m.pt").exists()
    text = run("bootstrap", "--dataset", "tiny", "--checkpoint", "m.pt", cwd=tmp_path)
    assert "max |ours - PyG|" in text


def test_generate_writes_a_loadable_file(tmp_path):
    run("datasets", "generate", "tiny", "--out", "t.npz", cwd=tmp_path)
    assert "tiny" in run("datasets", "info", "--dataset", "t.npz", cwd=tmp_path)


def test_demo_streams_the_held_out_updates_exactly(tmp_path):
    text = run("demo", "--dataset", "tiny", "--epochs", "2", "--batch-size", "100", cwd=tmp_path)
    assert "incremental engine" in text
    err = float(text.split("max |engine - PyG forward on the final graph|")[1].split("│")[1])
    assert err < 1e-4
