"""The agent's state machine as a table: which requests each state admits, with which code,
and which transitions exist (tryll_fast/workflow/agent.py owns both)."""
import pytest

from tryll_fast import codec
from tryll_fast.errors import AgentBusy, AgentNotPaused, ErrorCode
from tryll_fast.workflow.agent import ADMISSION, Agent, AgentState
from tryll_fast.workflow.graph import Graph
from tryll_fast.workflow.variables import Variables

S = AgentState
I, R, P, K = S.IDLE, S.RUNNING, S.PAUSED, S.KV_OPERATION

# request -> the states that admit it, written out from the protocol's rules: one turn at a
# time; dialog edits, snapshots, KV-cache operations and SetAgentVoice idle-only; params
# and variables idle or paused; cancel, destroy, reads and SetAgentDeliveryMode any time.
EXPECTED = {
    "SendMessageRequest": {I},
    "ResumeAgentRequest": {P},
    "CancelRequest": {I, R, P, K},
    "DestroyAgentRequest": {I, R, P, K},
    "ChangeAgentParamRequest": {I, P},
    "UpdateAgentVariablesRequest": {I, P},
    "GetAgentVariablesRequest": {I, R, P, K},
    "AppendInteractionsRequest": {I},
    "RemoveInteractionsFromEndRequest": {I},
    "ExportDialogRequest": {I},
    "ImportDialogRequest": {I},
    "SaveDialogRequest": {I},
    "LoadDialogRequest": {I},
    "PrefillAgentKvCacheRequest": {I},
    "EvictAgentKvCacheRequest": {I},
    "GetAgentKvCacheStatusRequest": {I},
    "SetAgentVoiceRequest": {I},
    "SetAgentDeliveryModeRequest": {I, R, P, K},
}


class _Turn:
    """Enough of a turn for destroy() to cancel it."""
    cancelled = None

    def cancel(self, mode):
        self.cancelled = mode


def agent_in(state: AgentState) -> Agent:
    a = Agent(7, None, None, Graph({}, ""), Variables([]), default_model="", diagnostics=False,
              maintain_history=True, workload=0, kv_init=0)
    with a.lock:
        if state in (R, P):
            a.begin_turn(_Turn())
        if state == P:
            assert a.pause()
        if state == K:
            a.begin_kv_operation()
    if state == S.DESTROYED:
        a.destroy()
    assert a.state is state
    return a


def test_the_table_covers_every_agent_request():
    agent_requests = {m.name for m in codec.MessageBody if m.value
                      and "agent_id" in getattr(codec, m.name).FIELDS
                      and m.name.endswith("Request") and m.name != "CreateAgentRequest"}
    assert set(ADMISSION) == agent_requests == set(EXPECTED)


@pytest.mark.parametrize("request_name", sorted(EXPECTED))
@pytest.mark.parametrize("state", [I, R, P, K])
def test_admission(request_name, state):
    agent = agent_in(state)
    with agent.lock:
        if state in EXPECTED[request_name]:
            agent.admit(request_name)
            return
        with pytest.raises((AgentBusy, AgentNotPaused)) as info:
            agent.admit(request_name, "why")
    code = (ErrorCode.AgentNotPaused if request_name == "ResumeAgentRequest"
            else ErrorCode.AgentBusy)
    assert info.value.code == code
    assert info.value.message.startswith("agent 7 is ")


def test_a_destroyed_agent_admits_nothing():
    agent = agent_in(S.DESTROYED)
    for name in EXPECTED:
        with pytest.raises((AgentBusy, AgentNotPaused)):
            agent.admit(name)


def test_transitions():
    a = agent_in(I)
    with a.lock:
        turn = _Turn()
        a.begin_turn(turn)
        assert (a.state, a.turn) == (R, turn)
        with pytest.raises(RuntimeError):
            a.begin_turn(_Turn())              # running -> running is no transition
        with pytest.raises(RuntimeError):
            a.begin_kv_operation()
        assert a.pause() and a.state is P
        assert not a.pause()                    # only a running turn pauses
        a.unpause()
        assert a.state is R
        a.end_turn()
        assert (a.state, a.turn) == (I, None)
        a.begin_kv_operation()
        assert a.state is K and not a.kv_job_done.is_set()
        a.end_kv_operation()
        assert a.state is I and a.kv_job_done.is_set()
    # destroyed is final: ending a turn or a KV operation leaves it destroyed
    b = agent_in(R)
    assert b.destroy() is b.turn and b.turn.cancelled == codec.CancelMode.StopAndDiscard
    with b.lock:
        assert not b.pause()
        b.unpause()
        b.end_turn()
        b.end_kv_operation()
    assert b.state is S.DESTROYED
