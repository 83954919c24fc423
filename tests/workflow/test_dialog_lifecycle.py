"""SPEC §7 over TCP with the real SmolLM2: dialog edits, stateless seeds, TDLG export and
import, save and load (across a restart, and under kill -9), and the KV-cache requests."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from flows import SMOL, canned, create, gen, graph, node, texts, turn
from wire import MODELS_DIR, Wire, start_server

Status = codec.TurnStatus
Pair = codec.DialogInteraction
Residency = codec.KvResidency
Prefix = codec.KvPrefixStatus


def baker(max_tokens=12):
    return graph(node("answer", gen(max_tokens=max_tokens)))


def prompt_of(frames, node_name="answer"):
    info = json.loads(frames[-1].debug_info)
    return next(n for n in info["nodes"] if n["node"] == node_name)


def append(w, aid, *pairs):
    r = w.request(codec.AppendInteractionsRequest(
        request_id=w.rid(), agent_id=aid, interactions=[Pair(user_message=u,
                                                              assistant_message=a)
                                                         for u, a in pairs]))
    assert isinstance(r, codec.AppendInteractionsResponse), r
    return r.appended_count


def remove(w, aid, count):
    r = w.request(codec.RemoveInteractionsFromEndRequest(request_id=w.rid(), agent_id=aid,
                                                         count=count))
    assert isinstance(r, codec.RemoveInteractionsFromEndResponse), r
    return r.removed_count


def export(w, aid):
    r = w.request(codec.ExportDialogRequest(request_id=w.rid(), agent_id=aid))
    assert isinstance(r, codec.ExportDialogResponse), r
    return bytes(r.snapshot)


def snap(data):
    return codec.decode_root(codec.PersistedDialogSnapshot, data).to_dict()


def kind(component):
    return next(iter(component["body"]))


def body(component):
    return next(iter(component["body"].values()))


def dialog_of(data):
    """The snapshot's interactions without timestamps (to compare two dialogs)."""
    out = []
    for i in snap(data)["interactions"]:
        comps = []
        for c in i["components"]:
            c = dict(c)
            c.pop("created_at_ms")
            comps.append(c)
        out.append((i["outcome"], comps))
    return out


def do_import(w, aid, data, compatibility=codec.DialogCompatibility.Strict):
    return w.request(codec.ImportDialogRequest(request_id=w.rid(), agent_id=aid,
                                               snapshot=data, compatibility=compatibility))


def kv(w, cls, aid):
    return w.request(cls(request_id=w.rid(), agent_id=aid))


# ---- edits ----

@pytest.mark.model
def test_append_and_remove_count_like_the_seed(w):
    aid = create(w, baker())
    assert append(w, aid) == 0
    assert append(w, aid, ("", ""), ("", "")) == 0
    assert append(w, aid, ("Hi", "Hello, traveller."), ("", ""), ("", "Fresh bread!"),
                  ("Bye", "")) == 3
    comps = [[(kind(c), c["producer"], c["history_role"], c["slot_name"])
              for c in i["components"]] for i in snap(export(w, aid))["interactions"]]
    U, A = "PersistedUserMessage", "PersistedAssistantMessage"
    inj = codec.PersistedProducer.ClientInjected
    user = (U, inj, codec.PersistedHistoryRole.User, "user_message")
    bot = (A, inj, codec.PersistedHistoryRole.Assistant, "assistant_message")
    assert comps == [[user, bot], [bot], [user]]
    assert remove(w, aid, 0) == 0
    assert remove(w, aid, 2) == 2
    assert remove(w, aid, 10) == 1                   # saturating
    assert snap(export(w, aid))["interactions"] == []


@pytest.mark.model
def test_scripted_history_is_projected_and_edits_resync(w):
    aid = create(w, baker(), enable_diagnostics=True)
    append(w, aid, ("My name is Kaelen.", "Nice to meet you, Kaelen."))
    frames = turn(w, aid, "What do you sell?")
    p = prompt_of(frames)
    assert "My name is Kaelen." in p["prompt"] and "Nice to meet you, Kaelen." in p["prompt"]
    assert p["history_interactions"] == 1
    assert remove(w, aid, 2) == 2
    p = prompt_of(turn(w, aid, "What do you sell?"))
    assert "Kaelen" not in p["prompt"] and p["history_interactions"] == 0


@pytest.mark.model
def test_stateless_agent_takes_a_scripted_seed_for_one_turn(w):
    aid = create(w, baker(), enable_diagnostics=True, maintain_dialogue_history=False)
    append(w, aid, ("My name is Kaelen.", "Welcome, Kaelen."))
    first = prompt_of(turn(w, aid, "Hello!"))
    assert "Welcome, Kaelen." in first["prompt"]
    assert snap(export(w, aid))["interactions"] == []     # cleared after the turn
    second = prompt_of(turn(w, aid, "Hello!"))
    assert "Kaelen" not in second["prompt"] and second["history_interactions"] == 0


@pytest.mark.model
def test_idle_only_requests_are_3004_while_running_and_paused(w):
    aid = create(w, graph(node("wait", codec.PauseParams(default_exit="a")),
                          node("a", gen(max_tokens=200))))
    blank = codec.PersistedDialogSnapshot(format_version=1)
    busy = [
        (codec.AppendInteractionsRequest, dict(interactions=[Pair(user_message="x")])),
        (codec.RemoveInteractionsFromEndRequest, dict(count=1)),
        (codec.ExportDialogRequest, {}),
        (codec.ImportDialogRequest, dict(snapshot=codec.encode_root(blank))),
        (codec.SaveDialogRequest, dict(save_id="busy")),
        (codec.LoadDialogRequest, dict(save_id="busy")),
        (codec.PrefillAgentKvCacheRequest, {}),
        (codec.EvictAgentKvCacheRequest, {}),
        (codec.GetAgentKvCacheStatusRequest, {}),
    ]
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text="Tell me a long story."))
    f = w.recv()
    while not (isinstance(f, codec.NodeEvent) and f.event_type == "paused"):
        f = w.recv()
    for cls, kw in busy:
        err = w.expect_error(cls(request_id=w.rid(), agent_id=aid, **kw), ErrorCode.AgentBusy)
        assert "paused in a turn" in err.message, err.message
    w.send(codec.ResumeAgentRequest(request_id=w.rid(), agent_id=aid))
    f = w.recv()
    while not isinstance(f, codec.AnswerText):
        f = w.recv()
    for cls, kw in busy:
        err = w.expect_error(cls(request_id=w.rid(), agent_id=aid, **kw), ErrorCode.AgentBusy)
        assert "running a turn" in err.message, err.message
    w.send(codec.CancelRequest(request_id=w.rid(), agent_id=aid))
    done = [f for f in w.other if isinstance(f, codec.TurnComplete)] or \
        w.recv_until(codec.TurnComplete)[-1:]
    assert done[0].request_id == 1


# ---- export / import ----

@pytest.mark.model
def test_export_import_continues_the_conversation_identically(w):
    a = create(w, baker(), enable_diagnostics=True)
    turn(w, a, "Hello! I am Kaelen.")
    turn(w, a, "What bread do you bake?")
    data = export(w, a)
    s = snap(data)
    assert s["format_version"] == 1 and s["node_names"] == ["answer"]
    assert len(s["graph_fingerprint"]) == 64 and s["locale"] == "en"
    assert [i["interaction_id"] for i in s["interactions"]] == [1, 2]
    b = create(w, baker(), enable_diagnostics=True)
    r = do_import(w, b, data)
    assert isinstance(r, codec.ImportDialogResponse), r
    assert r.interaction_count == 2 and list(r.warnings) == []
    assert dialog_of(export(w, b)) == dialog_of(data)
    fa = turn(w, a, "And how much is it?")
    fb = turn(w, b, "And how much is it?")
    assert prompt_of(fa)["prompt"] == prompt_of(fb)["prompt"]
    assert prompt_of(fa)["prompt_tokens"] == prompt_of(fb)["prompt_tokens"]
    assert texts(fa) and texts(fb)


def test_template_messages_survive_export_and_import(w):
    """The node's template message of each turn travels as an instruction named
    template:<where> with its role; an imported dialog projects exactly as the original."""
    templated = graph(node("answer", gen(max_tokens=8, template="Today: {{user_message}}",
                                         placement=codec.Placement.AfterUserAsSystem)))
    a = create(w, templated, enable_diagnostics=True)
    turn(w, a, "Hello! I am Kaelen.")
    data = export(w, a)
    comps = snap(data)["interactions"][0]["components"]
    kept = [c for c in comps if kind(c) == "PersistedInstruction"]
    assert [body(c) for c in kept] == [{"name": "template:after",
                                        "text": "Today: Hello! I am Kaelen."}]
    assert kept[0]["history_role"] == codec.PersistedHistoryRole.System
    b = create(w, templated, enable_diagnostics=True)
    assert isinstance(do_import(w, b, data), codec.ImportDialogResponse)
    assert dialog_of(export(w, b)) == dialog_of(data)
    fa, fb = turn(w, a, "Any bread?"), turn(w, b, "Any bread?")
    assert prompt_of(fa)["prompt"] == prompt_of(fb)["prompt"]
    assert "<|im_start|>system\nToday: Hello! I am Kaelen.<|im_end|>" in prompt_of(fa)["prompt"]


@pytest.mark.model
def test_tool_calls_survive_export_and_import(w):
    tools = [codec.ToolDefinition(name="open_door", description="Open a door.",
                                  parameters=[codec.ToolParamDefinition(
                                      name="door", type="string",
                                      enum_values=["front"])])]
    g = graph(node("detect", codec.ToolCallParams(
        system_prompt="You are Brenna, a baker. You can act with tools.", tools=tools,
        mode=codec.ToolCallMode.RequireCall, disposition=codec.ToolCallDisposition.AwaitResult,
        tool_called_exit="answer", sampling=codec.SamplingOverrides(temperature=0,
                                                                    max_tokens=40))),
        node("answer", gen(max_tokens=8)))
    a = create(w, g, enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=a,
                                    text="Please open the front door."))
    call = None
    while True:
        f = w.recv()
        if isinstance(f, codec.NodeEvent) and f.event_type == "tool_call":
            call = {p.key: p.value for p in f.kv_pairs}
        if isinstance(f, codec.NodeEvent) and f.event_type == "paused":
            break
    w.send(codec.ResumeAgentRequest(request_id=w.rid(), agent_id=a, tool_results=[
        codec.ToolResult(call_id=call["call_id"], result='{"opened": true}')]))
    w.recv_until(codec.TurnComplete)
    data = export(w, a)
    comps = snap(data)["interactions"][0]["components"]
    bodies = {kind(c): c for c in comps}
    tc = bodies["PersistedToolCall"]
    tr = bodies["PersistedToolResult"]
    assert body(tc)["call_id"] == body(tr)["call_id"] == call["call_id"]
    assert body(tc)["state"] == codec.PersistedToolCallState.Resolved
    assert body(tc)["disposition"] == "await_result"
    assert tr["producer"] == codec.PersistedProducer.ClientToolResult
    assert tr["history_role"] == codec.PersistedHistoryRole.Tool
    b = create(w, g, enable_diagnostics=True)
    assert do_import(w, b, data).interaction_count == 1
    assert dialog_of(export(w, b)) == dialog_of(data)


@pytest.mark.model
def test_import_checks_the_graph(w):
    a = create(w, baker())
    append(w, a, ("Hi", "Hello."))
    data = export(w, a)
    other = create(w, graph(node("greet", canned("Hello.")), node("answer", gen())))
    err = w.expect_error(codec.ImportDialogRequest(request_id=w.rid(), agent_id=other,
                                                   snapshot=data), ErrorCode.DialogGraphMismatch)
    assert "AllowGraphMismatch" in err.message
    assert snap(export(w, other))["interactions"] == []
    r = do_import(w, other, data, codec.DialogCompatibility.AllowGraphMismatch)
    assert r.interaction_count == 1 and "graph_fingerprint" in r.warnings[0]
    # a mutable param change keeps the fingerprint; the same graph imports under Strict
    same = create(w, baker())
    assert do_import(w, same, data).interaction_count == 1
    assert w.request(codec.ChangeAgentParamRequest(
        request_id=w.rid(), agent_id=same, node_name="answer",
        params=gen(max_tokens=12, system_prompt="You are a smith."))).__class__ is codec.Ack
    assert do_import(w, same, data).interaction_count == 1
    longer = create(w, baker(max_tokens=30))          # max_tokens is structural
    w.expect_error(codec.ImportDialogRequest(request_id=w.rid(), agent_id=longer,
                                             snapshot=data), ErrorCode.DialogGraphMismatch)
    err = w.expect_error(codec.ImportDialogRequest(request_id=w.rid(), agent_id=same,
                                                   snapshot=data, compatibility=7),
                         ErrorCode.InvalidParamValue)
    assert "compatibility 7" in err.message


def _bad_snapshots(good: bytes):
    s = snap(good)
    inter = s["interactions"]

    def enc(**changes):
        return codec.encode_root(codec.PersistedDialogSnapshot(**{**s, **changes}))

    tool_result = codec.PersistedComponent(
        node_name="answer", slot_name="answer", body=codec.PersistedToolResult(
            call_id="c00000000", result="x"))
    yield b"", "empty"
    yield enc(format_version=0), "format_version"
    yield enc(format_version=2), "newer than this server reads"
    yield enc(interactions=[inter[0], inter[0]]), "interactions[1]: interaction_id 1"
    yield enc(interactions=[{**inter[0], "interaction_id": 0}]), "interaction_id 0"
    yield enc(interactions=[{**inter[0], "components": [
        {"node_name": "x"}]}]), "interactions[0].components[0]: has no body"
    yield enc(interactions=[{**inter[0], "components": [tool_result]}]), \
        "no earlier tool call"


@pytest.mark.model
def test_invalid_snapshots_are_3019_and_change_nothing(w):
    a = create(w, baker())
    append(w, a, ("Hi", "Hello."), ("How are you?", "Busy baking."))
    good = export(w, a)
    b = create(w, baker())
    append(w, b, ("Keep", "me"))
    before = dialog_of(export(w, b))
    for data, words in _bad_snapshots(good):
        err = w.expect_error(codec.ImportDialogRequest(request_id=w.rid(), agent_id=b,
                                                       snapshot=data),
                             ErrorCode.InvalidDialogSnapshot)
        assert words in err.message, (words, err.message)
        assert dialog_of(export(w, b)) == before
    # bytes that are no FlatBuffer at all fail the frame's verification: 5001, naming it
    frame = bytearray(codec.encode(codec.ImportDialogRequest(request_id=77, agent_id=b,
                                                             snapshot=good)))
    at = frame.find(good)
    frame[at + 4:at + 12] = b"\xff" * 8                 # the root's vtable offset
    w.send_raw(bytes(frame))
    err = w.recv()
    assert isinstance(err, codec.ErrorResponse) and err.code == ErrorCode.MalformedMessage
    assert err.request_id == 77 and "snapshot" in err.message, err.message
    assert dialog_of(export(w, b)) == before


@pytest.mark.model
def test_broken_files_are_3019(server, w):
    aid = create(w, baker())
    append(w, aid, ("Hi", "Hello."))
    good = export(w, aid)
    folder = server.config.storage_root / "dialogs"
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate([b"\x00" * 64, good[:len(good) // 2],
                              codec.encode_root(codec.Ack(request_id=1)),
                              good[:4] + b"XXXX" + good[8:]]):
        (folder / f"broken{i}.tdlg").write_bytes(data)
        err = w.expect_error(codec.LoadDialogRequest(request_id=w.rid(), agent_id=aid,
                                                     save_id=f"broken{i}"),
                             ErrorCode.InvalidDialogSnapshot)
        assert "not a valid TDLG buffer" in err.message, err.message


@pytest.mark.model
def test_a_snapshot_over_one_mib_is_3021(w):
    aid = create(w, baker())
    big = "bread " * 100_000                               # 600 KB per side
    append(w, aid, (big, ""))
    append(w, aid, ("", big))
    err = w.expect_error(codec.ExportDialogRequest(request_id=w.rid(), agent_id=aid),
                         ErrorCode.DialogSnapshotTooLarge)
    assert "RemoveInteractionsFromEnd" in err.message
    w.expect_error(codec.SaveDialogRequest(request_id=w.rid(), agent_id=aid, save_id="big"),
                   ErrorCode.DialogSnapshotTooLarge)
    assert remove(w, aid, 1) == 1
    assert len(export(w, aid)) > 500_000


# ---- save / load ----

def save(w, aid, save_id):
    r = w.request(codec.SaveDialogRequest(request_id=w.rid(), agent_id=aid, save_id=save_id))
    assert isinstance(r, codec.SaveDialogResponse), r
    return r


def load(w, aid, save_id, **kw):
    return w.request(codec.LoadDialogRequest(request_id=w.rid(), agent_id=aid,
                                             save_id=save_id, **kw))


@pytest.mark.model
def test_save_and_load(server, w):
    a = create(w, baker())
    append(w, a, ("Hi", "Hello."), ("Bread?", "Rye today."))
    before_ms = int(time.time() * 1000)
    r = save(w, a, "brenna-slot_1.v2")
    after_ms = int(time.time() * 1000) + 1
    assert r.save_id == "brenna-slot_1.v2" and r.interaction_count == 2
    assert before_ms <= r.written_at_ms <= after_ms          # stamped while saving
    path = server.config.storage_root / "dialogs" / "brenna-slot_1.v2.tdlg"
    assert dialog_of(path.read_bytes()) == dialog_of(export(w, a))
    b = create(w, baker())
    r = load(w, b, "brenna-slot_1.v2")
    assert isinstance(r, codec.LoadDialogResponse), r
    assert r.interaction_count == 2 and list(r.warnings) == [] and r.save_id == "brenna-slot_1.v2"
    assert dialog_of(export(w, b)) == dialog_of(export(w, a))
    append(w, a, ("More?", "Always."))
    assert save(w, a, "brenna-slot_1.v2").interaction_count == 3     # replaces
    assert load(w, b, "brenna-slot_1.v2").interaction_count == 3
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp


@pytest.mark.model
def test_a_save_that_cannot_be_written_is_3022_and_leaves_no_file(server, w):
    """Unwritable places made from what the OS refuses even to root (chmod would not stop
    a root test run): the dialogs folder is a regular file, or the target is a directory.
    Writes are atomic (tryll_fast/server/saves.py): nothing partial may remain."""
    aid = create(w, baker())
    append(w, aid, ("Hi", "Hello."))
    folder = server.config.storage_root / "dialogs"
    folder.mkdir(parents=True, exist_ok=True)
    # the target's name is taken by a non-empty directory: the temporary file is written
    # in full, then the rename onto the directory fails
    (folder / "taken.tdlg").mkdir()
    (folder / "taken.tdlg" / "keep").write_bytes(b"mine")
    listing = sorted(p.name for p in folder.iterdir())
    err = w.expect_error(codec.SaveDialogRequest(request_id=w.rid(), agent_id=aid,
                                                 save_id="taken"), ErrorCode.DialogWriteFailed)
    assert err.code == 3022 and "cannot write" in err.message and "taken.tdlg" in err.message
    assert sorted(p.name for p in folder.iterdir()) == listing       # no temporary file
    assert [p.name for p in (folder / "taken.tdlg").iterdir()] == ["keep"]
    assert (folder / "taken.tdlg" / "keep").read_bytes() == b"mine"
    # the dialogs folder itself is a regular file: nothing can be created under it
    aside = folder.with_name("dialogs-aside")
    folder.rename(aside)
    try:
        folder.write_bytes(b"not a folder")
        err = w.expect_error(codec.SaveDialogRequest(request_id=w.rid(), agent_id=aid,
                                                     save_id="slot"),
                             ErrorCode.DialogWriteFailed)
        assert err.code == 3022 and "cannot write" in err.message, err.message
        assert folder.read_bytes() == b"not a folder"
        assert sorted(p.name for p in folder.parent.iterdir()
                      if p.name.startswith("dialogs")) == ["dialogs", "dialogs-aside"]
    finally:
        folder.unlink()
        aside.rename(folder)
    # nothing of the failures stuck: the same agent saves and loads again
    assert save(w, aid, "slot").interaction_count == 1
    assert load(w, aid, "slot").interaction_count == 1
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]
    shutil.rmtree(folder / "taken.tdlg")


@pytest.mark.model
@pytest.mark.parametrize("save_id,words", [
    ("", "empty"), ("../escape", "contains '/'"), ("a/b", "contains '/'"),
    ("..", "starts with '.'"), (".hidden", "starts with '.'"), ("x" * 129, "129 characters"),
    ("slot 1", "contains ' '"), ("C:\\saves", "contains ':\\\\'"), ("ünï", "contains 'ïü'"),
])
def test_bad_save_ids_are_3017(w, save_id, words):
    aid = create(w, baker())
    for cls in (codec.SaveDialogRequest, codec.LoadDialogRequest):
        err = w.expect_error(cls(request_id=w.rid(), agent_id=aid, save_id=save_id),
                             ErrorCode.InvalidSaveId)
        assert words in err.message, err.message


@pytest.mark.model
def test_load_failures(server, w):
    aid = create(w, baker())
    err = w.expect_error(codec.LoadDialogRequest(request_id=w.rid(), agent_id=aid,
                                                 save_id="never"), ErrorCode.DialogFileNotFound)
    assert "never.tdlg" in err.message
    folder = server.config.storage_root / "dialogs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "junk.tdlg").write_bytes(b"not a snapshot at all")
    w.expect_error(codec.LoadDialogRequest(request_id=w.rid(), agent_id=aid, save_id="junk"),
                   ErrorCode.InvalidDialogSnapshot)
    (folder / "huge.tdlg").write_bytes(b"\x00" * ((1 << 20) + 1))
    w.expect_error(codec.LoadDialogRequest(request_id=w.rid(), agent_id=aid, save_id="huge"),
                   ErrorCode.DialogSnapshotTooLarge)


@pytest.mark.model
def test_save_and_load_survive_a_restart(model_file, tmp_path):
    model_file(SMOL)
    kw = dict(models_dir=MODELS_DIR, overrides=["llama.max_n_ctx=2048"])
    srv = start_server(tmp_path, **kw)
    try:
        with Wire(srv.address, timeout=120) as w:
            w.create_session(locale="en")
            aid = create(w, baker(), enable_diagnostics=True)
            turn(w, aid, "Hello! I am Kaelen.")
            save(w, aid, "kaelen")
            before = dialog_of(export(w, aid))
            expected = turn(w, aid, "What is my name?")
    finally:
        srv.shutdown(5)
    srv = start_server(tmp_path, **kw)
    try:
        with Wire(srv.address, timeout=120) as w:
            w.create_session(locale="en")
            aid = create(w, baker(), enable_diagnostics=True)
            assert load(w, aid, "kaelen").interaction_count == 1
            assert dialog_of(export(w, aid)) == before
            again = turn(w, aid, "What is my name?")
            # the same prompt, token for token (the reply itself may differ in a last
            # digit of float rounding: fresh KV is computed in other batches than reused)
            assert prompt_of(again)["prompt"] == prompt_of(expected)["prompt"]
            assert prompt_of(again)["prompt_tokens"] == prompt_of(expected)["prompt_tokens"]
            assert texts(again)
    finally:
        srv.shutdown(5)


def test_kill_9_during_save_dialog_leaves_a_whole_file(tmp_path):
    """SIGKILL the server while its SaveDialog is writing (its temporary file exists): the
    saved file is still the complete old snapshot, and the next save (by a new server)
    removes what the killed writer left behind."""
    store = tmp_path / "store"
    folder = store / "dialogs"
    path = folder / "slot.tdlg"
    cmd = [sys.executable, "-m", "tryll_fast.cli", "serve", "--port", "0", "--dev",
           "--models-dir", str(tmp_path / "models"), "--storage-root", str(store),
           "--log-format", "json"]
    chunk = "x" * 240_000
    caught = 0
    for attempt in range(4):
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        try:
            port = next(rec["port"] for rec in map(json.loads, proc.stderr)
                        if rec["msg"] == "listening")
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            with Wire(("127.0.0.1", port), timeout=30) as w:
                w.create_session()
                aid = create(w, graph(node("c", canned("hi"))))
                append(w, aid, *[(chunk, f"{attempt}-{i}") for i in range(2)])
                save(w, aid, "slot")
                old = path.read_bytes()
                append(w, aid, ("one more", "interaction"))
                seen = threading.Event()

                def killer(proc=proc, seen=seen):
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        if any(n.startswith(".slot.tdlg.") for n in os.listdir(folder)):
                            os.kill(proc.pid, signal.SIGKILL)
                            seen.set()
                            return
                    os.kill(proc.pid, signal.SIGKILL)

                t = threading.Thread(target=killer)
                t.start()
                try:
                    while t.is_alive():
                        for _ in range(4):
                            w.send(codec.SaveDialogRequest(request_id=w.rid(), agent_id=aid,
                                                           save_id="slot"))
                        for _ in range(4):
                            w.recv(timeout=10)
                except (TimeoutError, OSError):
                    pass                                     # the server is gone
                t.join()
            assert proc.wait(10) == -signal.SIGKILL
            data = path.read_bytes()
            assert [len(i["components"]) for i in snap(data)["interactions"]] in ([2, 2],
                                                                                 [2, 2, 2])
            if seen.is_set():
                caught += 1
                assert data == old or len(snap(data)["interactions"]) == 3
        finally:
            proc.kill()
            proc.wait()
    assert caught, "the kill never landed while a save was writing"
    srv = start_server(tmp_path, storage_root=str(store))
    try:
        with Wire(srv.address) as w:
            w.create_session()
            aid = create(w, graph(node("c", canned("hi"))))
            append(w, aid, ("a", "b"))
            save(w, aid, "slot")
    finally:
        srv.shutdown(2)
    assert sorted(p.name for p in folder.iterdir()) == ["slot.tdlg"]
    assert len(snap(path.read_bytes())["interactions"]) == 1


# ---- KV cache ----

@pytest.mark.model
def test_kv_prefill_status_evict_restore(server, w):
    aid = create(w, baker(), enable_diagnostics=True)
    s = kv(w, codec.GetAgentKvCacheStatusRequest, aid)
    assert (s.applicable, s.residency, s.prefix_status, s.eligible_node_count) == \
        (True, Residency.Resident, Prefix.NotCurrent, 1)
    p = kv(w, codec.PrefillAgentKvCacheRequest, aid)
    assert isinstance(p, codec.PrefillAgentKvCacheResponse), p
    assert (p.residency, p.prefix_status, p.contexts_created) == \
        (Residency.Resident, Prefix.Current, 1)
    assert p.tokens_decoded + p.tokens_reused > 10
    info = json.loads(p.debug_info)["nodes"][0]
    assert info["node"] == "answer" and "prompt" not in p.debug_info
    assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).prefix_status == Prefix.Current
    again = kv(w, codec.PrefillAgentKvCacheRequest, aid)
    assert (again.tokens_decoded, again.contexts_created) == (0, 0)
    assert again.tokens_reused == p.tokens_decoded + p.tokens_reused

    first = turn(w, aid, "Hello! I am Kaelen.")
    # the prefix was there: the turn decoded only the new user turn
    assert prompt_of(first)["tokens"]["cached"] + prompt_of(first)["tokens"]["shared_prefix"] \
        >= p.tokens_decoded + p.tokens_reused - 1
    assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).prefix_status == Prefix.NotCurrent
    synced = kv(w, codec.PrefillAgentKvCacheRequest, aid)
    assert synced.prefix_status == Prefix.Current and synced.tokens_reused > 0

    # a dialog changed from outside is no longer what the KV holds
    append(w, aid, ("I sell wool.", "Good wool keeps a body warm."))
    assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).prefix_status == Prefix.NotCurrent
    assert kv(w, codec.PrefillAgentKvCacheRequest, aid).prefix_status == Prefix.Current
    remove(w, aid, 1)
    assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).prefix_status == Prefix.NotCurrent
    assert kv(w, codec.PrefillAgentKvCacheRequest, aid).prefix_status == Prefix.Current

    key = repr(("agent", aid, "answer"))
    e = kv(w, codec.EvictAgentKvCacheRequest, aid)
    assert isinstance(e, codec.EvictAgentKvCacheResponse), e
    assert (e.contexts_evicted, e.residency, e.prefix_status) == \
        (1, Residency.Evicted, Prefix.NotCurrent)
    # the default tier: the KV went to a file, nothing of it stays in RAM
    [engine] = [e for e in server.engines() if key in e.memory()["sequences"]]
    mem = engine.memory()
    seq = mem["sequences"][key]
    assert (seq["resident"], seq["stored"], seq["host_bytes"]) == (False, "file", 0)
    spill_dir = mem["spill"]["dir"]
    assert seq["spill_bytes"] > 0 and len(os.listdir(spill_dir)) >= 1
    assert kv(w, codec.EvictAgentKvCacheRequest, aid).contexts_evicted == 0
    s = kv(w, codec.GetAgentKvCacheStatusRequest, aid)
    assert (s.residency, s.prefix_status) == (Residency.Evicted, Prefix.NotCurrent)

    restored = turn(w, aid, "What is my name?")
    assert restored[-1].status == Status.Success
    info = json.loads(restored[-1].debug_info)
    # the file came back: nothing re-prefilled, the turn decoded only its new input
    assert info["kv_restore"]["tokens_decoded"] == 0 and info["kv_restore"]["tokens_reused"] > 10
    tokens = prompt_of(restored)["tokens"]
    assert tokens["cached"] > tokens["prefilled"]
    assert engine.memory()["sequences"][key]["stored"] is None
    assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).residency == Residency.Resident

    # the restored agent saw exactly the prompt a never-evicted twin sees
    twin = create(w, baker(), enable_diagnostics=True)
    do_import(w, twin, export(w, aid))
    remove(w, twin, 1)
    assert prompt_of(turn(w, twin, "What is my name?"))["prompt"] == prompt_of(restored)["prompt"]


@pytest.mark.model
def test_kv_requests_for_other_agents(w):
    plain = create(w, graph(node("c", canned("hi"))))
    for cls in (codec.PrefillAgentKvCacheRequest, codec.EvictAgentKvCacheRequest,
                codec.GetAgentKvCacheStatusRequest):
        r = kv(w, cls, plain)
        assert (r.applicable, r.eligible_node_count) == (False, 0), r
    lazy = create(w, baker(), kv_cache_initialization=codec.KvCacheInitialization.DeferAllocation)
    assert kv(w, codec.GetAgentKvCacheStatusRequest, lazy).residency == Residency.Evicted
    assert turn(w, lazy, "Hi")[-1].status == Status.Success
    assert kv(w, codec.GetAgentKvCacheStatusRequest, lazy).residency == Residency.Resident
    eager = create(w, baker(), kv_cache_initialization=codec.KvCacheInitialization.Prefill)
    s = kv(w, codec.GetAgentKvCacheStatusRequest, eager)
    assert (s.residency, s.prefix_status) == (Residency.Resident, Prefix.Current)
    assert s.debug_info == ""                             # no diagnostics
    w.expect_error(codec.GetAgentKvCacheStatusRequest(request_id=w.rid(), agent_id=999999),
                   ErrorCode.InvalidAgentId)


@pytest.mark.model
@pytest.mark.parametrize("setting,tier", [
    ("workflow.kv_evict_tier=file", "file"),
    ("workflow.kv_evict_tier=host", "host"),
    ("workflow.kv_evict_tier=free", "free"),
])
def test_eviction_tiers(model_file, tmp_path, setting, tier):
    model_file(SMOL)
    root = tmp_path / "kv"
    srv = start_server(tmp_path, models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=2048", setting, f"llama.kv_spill_dir={root}"])
    try:
        with Wire(srv.address, timeout=120) as w:
            w.create_session(locale="en")
            aid = create(w, baker(), enable_diagnostics=True)
            append(w, aid, *[(f"Tell me about the {x}.", f"The {x} is lovely.")
                             for x in ("mill", "bridge", "river")])
            assert kv(w, codec.PrefillAgentKvCacheRequest, aid).prefix_status == Prefix.Current
            e = kv(w, codec.EvictAgentKvCacheRequest, aid)
            assert (e.contexts_evicted, e.residency) == (1, Residency.Evicted)
            key = repr(("agent", aid, "answer"))
            [engine] = srv.engines()
            mem = engine.memory()
            spilled = sorted(root.rglob("*.kv"))
            if tier == "free":
                assert key not in mem["sequences"] and not spilled
            else:
                seq = mem["sequences"][key]
                assert not seq["resident"] and seq["stored"] == tier
                assert (seq["host_bytes"] > 0) == (tier == "host")
                assert (seq["spill_bytes"] > 0) == (tier == "file")
                assert len(spilled) == (tier == "file")
            frames = turn(w, aid, "And the forest?")
            assert frames[-1].status == Status.Success
            info = json.loads(frames[-1].debug_info)
            if tier == "free":
                assert info["kv_restore"]["tokens_decoded"] > 10  # the dialog re-prefilled
            else:
                assert info["kv_restore"]["tokens_decoded"] == 0  # the state comes back
            tokens = prompt_of(frames)["tokens"]
            assert tokens["cached"] > tokens["prefilled"]
            assert not any(root.rglob("*.kv"))
            assert kv(w, codec.GetAgentKvCacheStatusRequest, aid).residency == \
                Residency.Resident
    finally:
        srv.shutdown(5)
    # the model was unloaded: its spill directory went with it
    assert not root.exists() or not any(root.iterdir())
