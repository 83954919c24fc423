"""String storages: formats, validation and the loc/<language>/ preference, directly, then
over TCP: CreateStringStorage / DestroyStringStorage and their codes, and the nodes that
link them (CannedResponse, HumanMessageGuardrail), with the pin semantics (an agent keeps
what it linked)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import Kind, SessionStorages, StorageFiles, from_file, from_inline
from tryll_fast.knowledge.strings import MAX_NAME_CHARS, localized_path
from tryll_fast.server.config import SETTINGS_BY_KEY

Strategy = codec.CannedResponseSelectionStrategy


def code_of(fn) -> tuple[int, str]:
    with pytest.raises(TryllError) as err:
        fn()
    return err.value.code, err.value.message


# ---- formats, directly ----

def test_inline_list_map_and_multimap():
    assert from_inline("l", 0, ["b", "a"], []).values == ("b", "a")
    m = from_inline("m", 1, ["tea", "ale"], ["t", "a"])
    assert (m.keys, m.values) == (("a", "t"), ("ale", "tea"))          # sorted by key
    assert m.mapping() == {"a": "ale", "t": "tea"}
    mm = from_inline("mm", 2, ["x", "y", "z"], ["k", "j", "k"])
    assert mm.mapping() == {"j": ("y",), "k": ("x", "z")}               # order kept per key


@pytest.mark.parametrize("kind,strings,keys,field", [
    (0, [], [], "strings"),                     # nothing
    (0, ["a"], ["k"], "keys"),                  # keys on a List
    (1, ["a", "b"], ["k"], "keys"),             # unequal
    (1, [], [], "keys"),                        # empty map
    (1, ["a", "b"], ["k", "k"], "duplicate key 'k'"),
    (2, ["a"], [""], "empty key"),
    (7, ["a"], [], "kind"),
])
def test_inline_rules(kind, strings, keys, field):
    code, message = code_of(lambda: from_inline("s", kind, strings, keys))
    assert code == ErrorCode.InvalidStringStorageData and field in message


def test_files_of_each_kind(tmp_path):
    (tmp_path / "barks.txt").write_text("\ufeff# greetings\nHello!\n\n  Well met.  \n#x\n",
                                        encoding="utf-8")
    assert from_file("b", None, tmp_path / "barks.txt", "barks.txt").values == (
        "Hello!", "Well met.")
    records = [{"id": "wolf", "text": "Hunt it."}, {"id": 7, "text": "Seven.", "metadata": {}}]
    (tmp_path / "m.json").write_text(json.dumps(records), encoding="utf-8")
    m = from_file("m", 1, tmp_path / "m.json", "m.json")
    assert m.mapping() == {"7": "Seven.", "wolf": "Hunt it."}
    (tmp_path / "d.mm.json").write_text(json.dumps(records + records), encoding="utf-8")
    assert from_file("d", None, tmp_path / "d.mm.json", "d.mm.json").kind == Kind.Multimap
    # a Map file is a valid Multimap; a Multimap file is not a Map, nor a List a Map
    assert from_file("x", 2, tmp_path / "m.json", "m.json").kind == Kind.Multimap
    assert code_of(lambda: from_file("x", 1, tmp_path / "d.mm.json", "d.mm.json"))[0] == \
        ErrorCode.StorageKindMismatch
    assert code_of(lambda: from_file("x", 1, tmp_path / "barks.txt", "barks.txt"))[0] == \
        ErrorCode.StorageKindMismatch


@pytest.mark.parametrize("content,problem", [
    (b"[{\"id\": \"a\", \"text\": 1}]", "[0].text"),
    (b"[{\"text\": \"t\"}]", "[0].id"),
    (b"{\"id\": \"a\"}", "JSON array"),
    (b"[1]", "[0] is not an object"),
    (b"[{\"id\": \"a\", \"text\": \"x\"}, {\"id\": \"a\", \"text\": \"y\"}]", "duplicate key"),
    (b"[", "not JSON"),
    (b"[]", "empty array"),
    (b"\xff\xfe[]", "not UTF-8"),
])
def test_bad_map_files_name_the_problem(tmp_path, content, problem):
    (tmp_path / "m.json").write_bytes(content)
    code, message = code_of(lambda: from_file("m", 1, tmp_path / "m.json", "m.json"))
    assert code == ErrorCode.InvalidStringStorageData and problem in message
    assert "'m.json'" in message


def test_a_list_file_of_only_comments_is_refused(tmp_path):
    (tmp_path / "e.txt").write_text("# nothing\n\n", encoding="utf-8")
    code, message = code_of(lambda: from_file("e", 0, tmp_path / "e.txt", "e.txt"))
    assert code == ErrorCode.InvalidStringStorageData and "no values" in message


def test_localized_paths_prefer_the_tag_then_the_language():
    assert localized_path("npc/barks.txt", "pt-BR") == [
        "npc/loc/pt-BR/barks.txt", "npc/loc/pt/barks.txt", "npc/barks.txt"]
    assert localized_path("barks.txt", "de") == ["loc/de/barks.txt", "barks.txt"]
    assert localized_path("barks.txt", "") == ["barks.txt"]


def test_the_file_cache_reads_an_edited_file_again(tmp_path):
    files = StorageFiles(tmp_path)
    (tmp_path / "a.txt").write_text("one\n", encoding="utf-8")
    first = files.load("a.txt", "", "test")
    assert files.load("a.txt", "", "test") is first
    (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    os.utime(tmp_path / "a.txt", ns=(1, 1))                 # a different mtime for sure
    assert files.load("a.txt", "", "test").values == ("one", "two")


MAX_PER_SESSION = SETTINGS_BY_KEY["session.max_string_storages"].default_value()


def session_storages(tmp_path, **kw) -> SessionStorages:
    """With the server's default caps."""
    return SessionStorages(StorageFiles(tmp_path), max_storages=MAX_PER_SESSION,
                           max_chars=SETTINGS_BY_KEY["session.max_string_storage_chars"]
                           .default_value(), **kw)


def test_a_session_holds_a_bounded_number_of_storages(tmp_path):
    storages = session_storages(tmp_path)
    for i in range(MAX_PER_SESSION):
        storages.create(codec.CreateStringStorageRequest(name=f"s{i}", strings=["x"]), "")
    code, message = code_of(lambda: storages.create(
        codec.CreateStringStorageRequest(name="one more", strings=["x"]), ""))
    assert code == ErrorCode.SessionLimitReached and str(MAX_PER_SESSION) in message
    storages.destroy("s0")
    storages.create(codec.CreateStringStorageRequest(name="one more", strings=["x"]), "")


def test_a_name_an_embedded_storage_holds_is_7004(tmp_path):
    storages = session_storages(tmp_path, other_names=lambda: {"lore"})
    req = codec.CreateStringStorageRequest(name="lore", strings=["x"])
    assert code_of(lambda: storages.create(req, ""))[0] == ErrorCode.StorageNameInUse


# ---- over TCP ----

def create(w, **kw):
    return w.request(codec.CreateStringStorageRequest(request_id=w.rid(), **kw))


def destroy(w, name):
    return w.request(codec.DestroyStringStorageRequest(request_id=w.rid(), name=name))


def canned_agent(w, storage: str, **kw):
    g = codec.GraphDescription(start_node="c", nodes=[codec.NodeDescription(
        name="c", params=codec.CannedResponseParams(string_storage=storage, **kw))])
    return w.request(codec.CreateAgentRequest(request_id=w.rid(), graph=g))


def say(w, agent_id: int, text: str = "hi") -> str:
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent_id, text=text))
    frames = w.recv_until(codec.TurnComplete)
    assert frames[-1].status == codec.TurnStatus.Success, frames[-1]
    return "".join(f.text for f in frames if isinstance(f, codec.AnswerText))


def test_create_and_destroy_with_their_codes(w):
    reply = create(w, name="barks", strings=["Hello.", "Well met."])
    assert isinstance(reply, codec.CreateStringStorageResponse)
    assert (reply.name, reply.entry_count) == ("barks", 2)
    again = create(w, name="barks", strings=["x"])
    assert again.code == ErrorCode.StringStorageAlreadyExists and "'barks'" in again.message
    bad = create(w, name="prices", kind=codec.StringStorageKind.Map, strings=["1", "2"],
                 keys=["ale", "ale"])
    assert bad.code == ErrorCode.InvalidStringStorageData and "'ale'" in bad.message
    for name in ("", " x", "a\nb", "n" * (MAX_NAME_CHARS + 1)):
        assert create(w, name=name, strings=["x"]).code == ErrorCode.InvalidStringStorageName
    both = create(w, name="both", strings=["x"], file_path="a.txt")
    assert both.code == ErrorCode.InvalidStringStorageData and "not both" in both.message
    assert isinstance(destroy(w, "barks"), codec.Ack)
    gone = destroy(w, "barks")
    assert gone.code == ErrorCode.InvalidStringStorageName and "'barks'" in gone.message
    assert isinstance(create(w, name="barks", strings=["x"]), codec.CreateStringStorageResponse)


def test_paths_stay_under_the_storage_root(w, root):
    (root / "lists").mkdir(exist_ok=True)
    (root / "lists" / "ok.txt").write_text("a\nb\n", encoding="utf-8")
    (root / "lists" / "map.json").write_text('[{"id": "a", "text": "b"}]', encoding="utf-8")
    outside = root.parent / "secret.txt"
    outside.write_text("s\n", encoding="utf-8")
    link = root / "lists" / "link.txt"
    if not link.exists():
        link.symlink_to(outside)
    cases = {"/etc/hostname": ErrorCode.StorageOutsideRoot,
             "../secret.txt": ErrorCode.StorageOutsideRoot,
             "lists/link.txt": ErrorCode.StorageOutsideRoot,
             "lists/none.txt": ErrorCode.StorageFileNotFound,
             "lists/" + "x" * 300 + ".txt": ErrorCode.StorageFileNotFound,   # ENAMETOOLONG
             "lists/map.json": ErrorCode.StorageKindMismatch}     # a Map where a List is
    for i, (path, code) in enumerate(cases.items()):
        reply = create(w, name=f"p{i}", file_path=path)
        assert isinstance(reply, codec.ErrorResponse) and reply.code == code, (path, reply)
    assert create(w, name="ok", file_path="lists/ok.txt").entry_count == 2


def test_canned_response_reads_a_session_storage_and_keeps_it(w):
    assert create(w, name="lines", strings=["One.", "Two.", "Three."]).entry_count == 3
    agent = canned_agent(w, "lines").agent_id
    assert [say(w, agent) for _ in range(4)] == ["One.", "Two.", "Three.", "One."]
    # the session unpins it and pins another under the name: the agent keeps its own
    destroy(w, "lines")
    create(w, name="lines", strings=["Other."])
    assert say(w, agent) == "Two."
    # ChangeAgentParam recompiles the node against what the agent linked
    change = w.request(codec.ChangeAgentParamRequest(
        request_id=w.rid(), agent_id=agent, node_name="c",
        params=codec.CannedResponseParams(string_storage="lines",
                                          selection_strategy=Strategy.First)))
    assert isinstance(change, codec.Ack), change
    assert say(w, agent) == "One."
    # a new agent links the new one
    assert say(w, canned_agent(w, "lines").agent_id) == "Other."


def test_canned_response_reads_a_file_in_the_session_language(w, server, root):
    (root / "npc" / "loc" / "de").mkdir(parents=True, exist_ok=True)
    (root / "npc" / "greet.txt").write_text("Hello there.\n", encoding="utf-8")
    (root / "npc" / "loc" / "de" / "greet.txt").write_text("Hallo.\n", encoding="utf-8")
    assert say(w, canned_agent(w, "npc/greet.txt").agent_id) == "Hello there."
    w.request(codec.SetSessionLocaleRequest(request_id=w.rid(), locale="de-AT"))
    assert say(w, canned_agent(w, "npc/greet.txt").agent_id) == "Hallo."


@pytest.mark.parametrize("ref,code", [
    ("nothing", ErrorCode.GraphCompilationFailed),          # no storage, not a path
    ("missing.txt", ErrorCode.StorageFileNotFound),
    ("../x.txt", ErrorCode.StorageOutsideRoot),
    ("prices", ErrorCode.StorageKindMismatch),               # a Map for a List node
])
def test_a_bad_link_fails_agent_creation(w, ref, code):
    create(w, name="prices", kind=codec.StringStorageKind.Map, strings=["1"], keys=["ale"])
    reply = canned_agent(w, ref)
    assert isinstance(reply, codec.ErrorResponse) and reply.code == code, reply
    assert "'c'" in reply.message and repr(ref) in reply.message


def test_guardrail_patterns_from_a_storage_add_to_the_inline_ones(w, root):
    (root / "guard.txt").write_text("# refuse these\nswords?\n\\bdragon\n", encoding="utf-8")
    g = codec.GraphDescription(start_node="guard", nodes=[
        codec.NodeDescription(name="guard", params=codec.HumanMessageGuardrailParams(
            string_storage="guard.txt", inline_strings=["axes?"],
            triggered_exit="no", not_triggered_exit="yes")),
        codec.NodeDescription(name="no", params=codec.CannedResponseParams(
            lines=[codec.LocalizableText(text="No.")])),
        codec.NodeDescription(name="yes", params=codec.CannedResponseParams(
            lines=[codec.LocalizableText(text="Yes.")]))])
    agent = w.request(codec.CreateAgentRequest(request_id=w.rid(), graph=g)).agent_id
    assert [say(w, agent, t) for t in ("An axe?", "A SWORD!", "The dragon", "Bread")] == [
        "No.", "No.", "No.", "Yes."]
    (root / "bad.txt").write_text("fine\n(unclosed\n", encoding="utf-8")
    g = codec.GraphDescription(start_node="guard", nodes=[codec.NodeDescription(
        name="guard", params=codec.HumanMessageGuardrailParams(string_storage="bad.txt"))])
    reply = w.request(codec.CreateAgentRequest(request_id=w.rid(), graph=g))
    assert reply.code == ErrorCode.GraphCompilationFailed
    assert "'bad.txt' line 2" in reply.message


def test_storages_belong_to_their_session(server, w):
    from wire import Wire
    create(w, name="mine", strings=["x"])
    with Wire(server.address) as other:
        other.create_session()
        assert canned_agent(other, "mine").code == ErrorCode.GraphCompilationFailed
        assert destroy(other, "mine").code == ErrorCode.InvalidStringStorageName
    sid_storages = [s for s in server.sessions.values() if "mine" in s.strings.by_name]
    assert len(sid_storages) == 1
    session = sid_storages[0]
    w.close()
    from wire import wait_for
    assert wait_for(lambda: session.owned()["string_storages"] == 0)


def test_the_client_creates_and_destroys(server, root):
    from tryll_fast.client import TryllClient
    (root / "c.json").write_text(json.dumps([{"id": "k", "text": "v"}]), encoding="utf-8")
    with TryllClient(*server.address) as client:
        client.create_session()
        assert client.create_string_storage("s", ["a", "b"]) == 2
        assert client.create_string_storage("m", file_path="c.json", kind=1) == 1
        client.destroy_string_storage("s")
        with pytest.raises(TryllError) as err:
            client.destroy_string_storage("s")
        assert err.value.code == ErrorCode.InvalidStringStorageName
    assert Path(root / "c.json").exists()
