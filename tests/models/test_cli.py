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
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:-1]}
    assert rows["SmolLM2-135M-Instruct"][:3] == ["llm", "llama-cpp", "Absent"]
    assert rows["Qwen2.5-Coder-0.5B-Instruct"] == ["llm", "llama-cpp", "Absent", "491.4", "MB"]
    assert rows["Qwen2.5-Coder-1.5B-Instruct"][3:] == ["1.1", "GB"]
    assert "98.4 MB" in out and str(tmp_path) in out


def test_fetch_defaults_then_list_and_delete(tmp_path, capsys, local_catalog):
    models = str(tmp_path / "models")
    assert main(["models", "fetch", "--models-dir", models, "--catalog", local_catalog]) == 0
    captured = capsys.readouterr()
    assert "local-vad: " in captured.out and "vad.onnx" in captured.out
    assert "local-vad: 100% of 80.0 KB" in captured.err        # stderr is not a tty here
    assert (tmp_path / "models" / "local-vad" / "vad.onnx").read_bytes() == DATA
    # a second fetch says the model is there already, and fetches nothing
    assert main(["models", "fetch", "--models-dir", models, "--catalog", local_catalog]) == 0
    captured = capsys.readouterr()
    assert "local-vad: already present (" in captured.out and captured.err == ""

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


def test_progress_bar_on_a_terminal_is_one_bar_per_file():
    stream = FakeTty()
    bar = ProgressBar(stream, "m", {"m/a.bin": 2_000_000, "m/b.json": 3_000})
    for done in (0, 1_000_000, 2_000_000):               # request totals, file a
        bar(done, 2_003_000, "m/a.bin")
    bar(2_003_000, 2_003_000, "m/b.json")                # file b, whole at once
    bar.close()
    lines = [seg for seg in stream.getvalue().replace("\r", "\n").split("\n") if seg]
    a = [line for line in lines if line.startswith("m/a.bin")]
    b = [line for line in lines if line.startswith("m/b.json")]
    assert "100%" in a[-1] and "2.00M/2.00M" in a[-1]    # size, per file
    assert "100%" in b[-1] and "3.00k/3.00k" in b[-1]
    assert "B/s" in a[-1] and "<" in a[-1]                # speed and time left


def test_progress_to_a_pipe_is_a_line_per_tenth():
    stream = io.StringIO()
    bar = ProgressBar(stream, "m", {"m/a.bin": 1000})
    for done in range(0, 1001, 50):
        bar(done, 1000, "m/a.bin")
    bar.close()
    assert stream.getvalue().splitlines()[-1] == "m: 100% of 1.0 KB (m/a.bin)"
    assert len(stream.getvalue().splitlines()) == 11


def test_format_bytes():
    assert [format_bytes(n) for n in (5, 2_327_524, 253_113_024, 4.2e12)] == [
        "5 B", "2.3 MB", "253.1 MB", "4200.0 GB"]
