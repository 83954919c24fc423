"""`tryll-fast models ...`: list, fetch (progress on stderr, exit codes), delete."""
from __future__ import annotations

import io

import pytest
from model_helpers import sha256

from tryll_fast.cli import ProgressBar, format_bytes, main

DATA = b"\x01\x02" * 40_000


@pytest.fixture
def local_catalog(tmp_path):
    """A catalog whose default model is a file:// source, plus a hidden one."""
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    path = tmp_path / "catalog.toml"
    path.write_text(f'''format = 1
[[model]]
name = "local-vad"
role = "vad"
engine = "sherpa-onnx"
default = true
[[model.files]]
name = "vad.onnx"
size = {len(DATA)}
sha256 = "{sha256(DATA)}"
source = "file://{src}"

[[model]]
name = "secret"
role = "vad"
engine = "sherpa-onnx"
hidden = true
[[model.files]]
name = "x.onnx"
size = 1
sha256 = "{'0' * 64}"
source = "file://{tmp_path}/missing"
''')
    return str(path)


def test_list_packaged_catalog(tmp_path, capsys):
    assert main(["models", "list", "--models-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "ROLE", "ENGINE", "STATUS", "SIZE"]
    assert "SmolLM2-135M-Instruct  llm" in out and "Absent" in out
    assert "98.4 MB" in out and str(tmp_path) in out


def test_fetch_defaults_then_list_and_delete(tmp_path, capsys, local_catalog):
    models = str(tmp_path / "models")
    assert main(["models", "fetch", "--models-dir", models, "--catalog", local_catalog]) == 0
    captured = capsys.readouterr()
    assert "local-vad: " in captured.out and "vad.onnx" in captured.out
    assert "local-vad: 100% of 80.0 KB" in captured.err        # stderr is not a tty here
    assert (tmp_path / "models" / "local-vad" / "vad.onnx").read_bytes() == DATA

    assert main(["models", "list", "--models-dir", models, "--catalog", local_catalog]) == 0
    out = capsys.readouterr().out
    assert "Downloaded" in out and "secret" not in out
    assert main(["models", "list", "--all", "--models-dir", models,
                 "--catalog", local_catalog]) == 0
    assert "secret" in capsys.readouterr().out

    assert main(["models", "delete", "local-vad", "--models-dir", models,
                 "--catalog", local_catalog]) == 0
    assert "local-vad: deleted" in capsys.readouterr().out


def test_fetch_failures_exit_non_zero_with_the_message(tmp_path, capsys, local_catalog):
    models = str(tmp_path / "models")
    assert main(["models", "fetch", "no-such-model", "--models-dir", models]) == 1
    err = capsys.readouterr().err
    assert "no-such-model" in err and "6002" in err
    assert main(["models", "fetch", "-q", "secret", "--models-dir", models,
                 "--catalog", local_catalog]) == 1
    err = capsys.readouterr().err
    assert "secret/x.onnx" in err and "6002 DownloadNotAvailable" in err


def test_bad_catalog_and_usage(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('format = 1\n[[model]]\nname = "m"\nrole = "singer"\n')
    assert main(["models", "list", "--catalog", str(bad)]) == 1
    assert "model 'm': role: unknown role 'singer'" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["models"]) == 2
    with pytest.raises(SystemExit) as info:
        main(["models", "frobnicate"])
    assert info.value.code == 2


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal():
    stream = FakeTty()
    bar = ProgressBar(stream, "m")
    bar(0, 2_000_000, "m/a.bin")
    bar(1_000_000, 2_000_000, "m/a.bin")      # throttled: within 0.1 s of the last draw
    bar(2_000_000, 2_000_000, "m/a.bin")      # the final state is always drawn
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "[############################] 100.0% 2.0 MB/2.0 MB" in text


def test_format_bytes():
    assert [format_bytes(n) for n in (5, 2_327_524, 253_113_024, 4.2e12)] == [
        "5 B", "2.3 MB", "253.1 MB", "4200.0 GB"]
