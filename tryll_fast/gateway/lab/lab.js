// The Dialog Lab (docs/pipeline.md, "The Dialog Lab"): one pipeline WebSocket to the agent
// picked, JSON both ways. Typed lines and the microphone go up; tokens, speech (played on one
// AudioContext, the mouth drawn from its visemes), commands, errors and transcripts come down.
// `window.lab` is a read-only view of what happened, for the browser tests.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const OUTPUT_TYPES = new Set(['command', 'speech-item', 'speech', 'token', 'transcript',
    'visual-state', 'multimodal-interaction', 'navigation-specification', 'evaluation-status']);
  // errors that refuse the input they answer: no turn comes of the oldest message sent
  const REFUSALS = new Set(['UnknownAction', 'EmptyInput', 'TooManyPendingTurns']);
  const KNOWN_COMMANDS = new Set(['ready', 'turnComplete', 'sessionShouldEnd', 'exit', 'bargeIn']);
  const CAP = 500;            // entries kept per list in window.lab
  const EVENT_LINES = 200;    // lines kept in the events list
  // A turn's first chunk starts this far ahead, so the next chunk arrives before it ends.
  const START_LEAD_S = 0.12;

  const lab = {
    agent: null, url: null, state: 'connecting', connected: false, ready: false,
    sessionId: null, audioSampleRate: 0, turns: [], scheduledItems: 0, schedule: [],
    mouthHistory: [], errors: [], commands: [], transcripts: [], mic: 'off',
    micChunks: 0, micChunkBytes: 0,
  };
  Object.defineProperty(window, 'lab', { value: lab, enumerable: true });

  const audio = new AudioContext();
  lab.audioSampleRate = audio.sampleRate;
  Object.defineProperty(lab, 'audioTime', { get: () => audio.currentTime, enumerable: true });
  let agents = [];
  let ws = null;
  let pending = [];           // turns sent whose turnId has not come yet, oldest first
  let byId = new Map();       // turnId -> turn (this connection's)
  const views = new Map();    // turn -> its DOM nodes and playback state (not in window.lab)

  // ---- connection ----

  function connect() {
    if (ws) { ws.onopen = ws.onmessage = ws.onclose = null; ws.close(1000); }
    stopTalking(false);
    dropAudio(() => true);
    pending = [];
    byId = new Map();
    Object.assign(lab, { connected: false, ready: false, sessionId: null });
    const query = new URLSearchParams({
      agent: lab.agent, inputFormat: 'JSON', outputFormat: 'JSON', protocolVersion: '2',
      commitMode: $('mic-mode').value, audioSampleRate: String(audio.sampleRate),
    });
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    lab.url = `${scheme}://${location.host}/pipeline?${query}`;
    divider(`${lab.agent}`);
    setState('connecting');
    const sock = ws = new WebSocket(lab.url);
    sock.onopen = () => { lab.connected = true; setState('connected, creating the agent'); };
    sock.onmessage = (ev) => { if (typeof ev.data === 'string') handle(JSON.parse(ev.data)); };
    sock.onclose = (ev) => {
      lab.connected = lab.ready = false;
      stopTalking(false);
      setState(`closed (${ev.code}${ev.reason ? ': ' + ev.reason : ''})`, 'closed');
    };
  }

  // an element object as JSON text; microphone audio (an ArrayBuffer) as a binary frame
  function send(element) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return false;
    ws.send(element instanceof ArrayBuffer ? element : JSON.stringify(element));
    return true;
  }

  function setState(text, kind = '') {
    lab.state = text;
    $('state').textContent = text;
    $('state').className = `state ${kind}`;
    $('reconnect').hidden = kind !== 'closed';
  }

  function handle(m) {
    // A JSON error element repeats `type` (the error's own type wins in JSON.parse), so an
    // error is told by its fields.
    const kind = OUTPUT_TYPES.has(m.type) ? m.type
      : ('source' in m && 'message' in m) ? 'error' : m.type;
    if (kind === 'token') onToken(m);
    else if (kind === 'speech') onSpeech(m);
    else if (kind === 'speech-item') onSpeechItem(m);
    else if (kind === 'command') onCommand(m);
    else if (kind === 'error') onError(m);
    else if (kind === 'transcript') onTranscript(m);
    else logEvent('event', `${kind} ${JSON.stringify(m.interaction ?? m)}`);
  }

  // ---- turns ----

  function newTurn(said, sentAt) {
    const turn = { turnId: null, agent: lab.agent, said, text: '', tokens: [], speech: [],
      firstTokenMs: null, firstAudioMs: null, status: 'sent' };
    const li = document.createElement('li');
    li.className = 'turn';
    if (said) li.append(el('p', 'said', said));
    const answer = el('div', 'answer', '');
    const timing = el('p', 'timing', '');
    li.append(answer, timing);
    $('turns').append(li);
    li.scrollIntoView({ block: 'end' });
    views.set(turn, { li, answer, timing, sentAt, sources: [], sentence: null, played: 0 });
    lab.turns.push(turn);
    return turn;
  }

  function turnFor(turnId) {
    let turn = byId.get(turnId);
    if (!turn) {   // the oldest message sent, or a turn the mic started (no id: neither)
      turn = (turnId != null && pending.shift()) || newTurn(null, null);
      turn.turnId = turnId;
      byId.set(turnId, turn);
    }
    return turn;
  }

  function since(turn) {
    const sentAt = views.get(turn).sentAt;
    return sentAt == null ? null : Math.round(performance.now() - sentAt);
  }

  function showTiming(turn) {
    const ms = (v) => (v == null ? '–' : `${v} ms`);
    views.get(turn).timing.textContent = `first token ${ms(turn.firstTokenMs)} · first audio `
      + `${ms(turn.firstAudioMs)} · ${turn.status}`;
  }

  function onToken(m) {
    const turn = turnFor(m.turnId);
    if (turn.firstTokenMs == null) turn.firstTokenMs = since(turn);
    turn.tokens.push(m.text);
    turn.text += m.text;
    turn.status = 'streaming';
    views.get(turn).answer.textContent = turn.text;
    showTiming(turn);
  }

  function onSpeech(m) {
    const turn = turnFor(m.turnId);
    turn.speech.push(m.text);
    views.get(turn).li.append(el('p', 'speech', m.text));
  }

  function onSpeechItem(m) {
    const turn = turnFor(m.turnId);
    if (turn.firstAudioMs == null) { turn.firstAudioMs = since(turn); showTiming(turn); }
    if (turn.status !== 'interrupted') play(turn, m.item);
  }

  function onCommand(m) {
    const params = m.parameters || {};
    lab.commands.push({ name: m.name, turnId: m.turnId, parameters: params });
    capped(lab.commands);
    const tool = !KNOWN_COMMANDS.has(m.name);
    const line = `${m.name} ${JSON.stringify(params)}`;
    logEvent(tool ? 'tool' : 'command',
      `${tool ? 'tool ' : ''}${line}${m.turnId ? ` (turn ${m.turnId})` : ''}`);
    if (m.name === 'ready') {
      lab.ready = true;
      lab.sessionId = m.sessionId;
      setState(`ready: ${params.agent}`, 'ready');
    } else if (m.name === 'turnComplete') {
      const turn = turnFor(m.turnId);
      if (turn.status !== 'interrupted') turn.status = params.status;
      showTiming(turn);
    } else if (m.name === 'bargeIn') {
      const turn = byId.get(m.turnId);
      if (turn) { turn.status = 'interrupted'; dropAudio((t) => t === turn); showTiming(turn); }
    } else if (m.name === 'exit') {
      setState('the server is shutting down', 'closed');
    } else if (tool && m.turnId != null) {
      views.get(turnFor(m.turnId)).li.append(el('p', 'speech tool', line));
    }
  }

  function onError(m) {
    const error = { source: m.source, type: m.type, message: m.message, turnId: m.turnId,
      isRecoverable: m.isRecoverable };
    lab.errors.push(error);
    capped(lab.errors);
    logEvent('error', `error ${m.source}/${m.type}: ${m.message}`);
    let turn = null;
    if (m.turnId != null) turn = turnFor(m.turnId);
    else if (m.source === 'Pipeline' && REFUSALS.has(m.type)) turn = pending.shift();
    if (turn) {
      turn.status = m.turnId != null ? 'error' : 'refused';
      views.get(turn).li.append(el('p', 'timing error', `${m.type}: ${m.message}`));
      showTiming(turn);
    }
  }

  // ---- speech: gap-free playback on one AudioContext, the mouth from the visemes ----

  let nextStartTime = 0;      // where the next chunk starts on the audio clock
  let cues = [];              // {turn, viseme, time, until} on the audio clock, in time order
  let cue = null;             // the latest cue whose time has come

  function play(turn, item) {
    const view = views.get(turn);
    const bytes = atob(item.bytes);
    const samples = bytes.length >> 1;
    const sentence = view.sentence ||= { pieces: [], samples: 0, rate: item.sampleRate };
    if (samples > 0) {
      const buffer = audio.createBuffer(1, samples, item.sampleRate);
      const data = buffer.getChannelData(0);
      for (let i = 0; i < samples; i++) {      // int16 little-endian -> float
        const v = bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8);
        data[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
      }
      const source = audio.createBufferSource();
      source.buffer = buffer;
      source.connect(audio.destination);
      // Gap-free after what is queued; a chunk that comes after the queue ran dry starts
      // a little ahead (an underrun when the turn was already playing).
      const queued = nextStartTime > audio.currentTime + 0.005;
      const start = queued ? nextStartTime : audio.currentTime + START_LEAD_S;
      source.start(start);
      nextStartTime = start + buffer.duration;
      const playing = { source, end: nextStartTime };
      view.sources.push(playing);
      source.onended = () => {
        const i = view.sources.indexOf(playing);
        if (i >= 0) view.sources.splice(i, 1);
      };
      sentence.pieces.push({ first: sentence.samples, start });
      sentence.samples += samples;
      sentence.end = nextStartTime;
      lab.scheduledItems++;
      lab.schedule.push({ turnId: turn.turnId, start, end: nextStartTime, samples,
        sampleRate: item.sampleRate, late: !queued && view.played > 0 });
      capped(lab.schedule);
      view.played++;
    }
    if (item.isLast) {
      addCues(turn, sentence, item.visemes || []);
      view.sentence = null;
    }
  }

  // Cue offsets count from the sentence's first sample; a cue's time is found through the
  // chunk holding that sample, so an underrun mid-sentence does not shift the mouth.
  function addCues(turn, sentence, visemes) {
    if (!sentence.pieces.length) return;
    const times = visemes.map((c) => {
      let piece = sentence.pieces[0];
      for (const p of sentence.pieces) if (p.first <= c.sampleOffset) piece = p;
      return piece.start + (c.sampleOffset - piece.first) / sentence.rate;
    });
    visemes.forEach((c, i) => cues.push({ turn, viseme: c.viseme, time: times[i],
      until: i + 1 < times.length ? times[i + 1] : sentence.end }));
  }

  function dropAudio(which) {
    for (const [turn, view] of views) {
      if (!which(turn)) continue;
      for (const playing of view.sources.splice(0)) playing.source.stop();
      view.sentence = null;
    }
    cues = cues.filter((c) => !which(c.turn));
    if (cue && which(cue.turn)) cue = null;
    let end = audio.currentTime;
    for (const view of views.values()) {
      for (const playing of view.sources) end = Math.max(end, playing.end);
    }
    nextStartTime = Math.min(nextStartTime, end);
  }

  function resumeAudio() {
    if (audio.state === 'suspended') audio.resume();
  }

  // ---- the mouth: one shape per viseme of docs/voice.md, redrawn each animation frame ----

  // width and opening (fractions of the canvas), rounded lips, the teeth that show (top,
  // both, bite: upper teeth on the lower lip, clench: closed together), the tongue
  const SHAPES = {
    Silence: { w: 0.50, h: 0.03 },
    PP: { w: 0.44, h: 0, pressed: true },
    FF: { w: 0.52, h: 0.12, teeth: 'bite' },
    TH: { w: 0.54, h: 0.14, teeth: 'both', tongue: 'tip' },
    DD: { w: 0.56, h: 0.18, teeth: 'both', tongue: 'up' },
    KK: { w: 0.56, h: 0.24, teeth: 'top', tongue: 'back' },
    CH: { w: 0.40, h: 0.22, round: true, teeth: 'both' },
    SS: { w: 0.62, h: 0.12, teeth: 'clench' },
    NN: { w: 0.54, h: 0.16, tongue: 'up' },
    RR: { w: 0.42, h: 0.20, round: true },
    AA: { w: 0.60, h: 0.46, teeth: 'top', tongue: 'low' },
    E: { w: 0.64, h: 0.28, teeth: 'top', tongue: 'low' },
    IH: { w: 0.68, h: 0.16, teeth: 'both' },
    OH: { w: 0.40, h: 0.38, round: true, tongue: 'low' },
    OU: { w: 0.26, h: 0.20, round: true },
  };
  const canvas = $('mouth');
  const g = canvas.getContext('2d');
  let drawn = null;

  function drawMouth(name) {
    const s = SHAPES[name] || SHAPES.Silence;
    const cx = canvas.width / 2, cy = canvas.height / 2;
    const w = (s.w * canvas.width) / 2, h = (s.h * canvas.height) / 2;
    const lips = () => {
      g.beginPath();
      if (s.round) g.ellipse(cx, cy, w, Math.max(h, 2), 0, 0, 2 * Math.PI);
      else {                      // a quadratic's peak lies halfway to its control point
        g.moveTo(cx - w, cy);
        g.quadraticCurveTo(cx, cy - 2 * h, cx + w, cy);
        g.quadraticCurveTo(cx, cy + 2 * h, cx - w, cy);
      }
      g.closePath();
    };
    g.clearRect(0, 0, canvas.width, canvas.height);
    lips();
    if (h > 0) {
      g.fillStyle = '#4a1a1a';
      g.fill();
      g.save();
      g.clip();
      const teeth = Math.min(h * 0.45, 9) + 2;      // + what the lip line covers
      g.fillStyle = '#fbfaf5';
      if (s.teeth === 'bite') g.fillRect(cx - w, cy - h, 2 * w, 1.5 * h);
      else if (s.teeth === 'clench') g.fillRect(cx - w, cy - h, 2 * w, 2 * h);
      else if (s.teeth) g.fillRect(cx - w, cy - h, 2 * w, teeth);
      if (s.teeth === 'both') g.fillRect(cx - w, cy + h - teeth, 2 * w, teeth);
      if (s.teeth === 'clench') g.fillRect(cx - w, cy - 0.5, 2 * w, 1);   // where they meet
      const tongue = { low: [0, 0.7, 0.5, 0.45], up: [0, -0.3, 0.35, 0.35],
        tip: [0, 0, 0.3, 0.5], back: [0, 0.25, 0.6, 0.5] }[s.tongue];
      if (tongue) {
        g.fillStyle = s.tongue === 'back' ? '#a8484f' : '#d56b73';
        g.beginPath();
        g.ellipse(cx, cy + tongue[1] * h, tongue[2] * w, tongue[3] * h, 0, 0, 2 * Math.PI);
        g.fill();
      }
      g.restore();
    }
    lips();                       // the tongue's ellipse replaced the path
    g.lineWidth = s.pressed ? 9 : 4;
    g.strokeStyle = '#b5524b';
    g.stroke();
  }

  function animate() {
    const now = audio.currentTime;
    while (cues.length && cues[0].time <= now) cue = cues.shift();
    const active = cue && now < cue.until ? cue : null;
    const name = active ? active.viseme : 'Silence';
    const turnId = active ? active.turn.turnId : null;   // null: at rest, nothing playing
    if (!drawn || drawn.viseme !== name || drawn.turnId !== turnId) {
      drawMouth(name);
      $('viseme').textContent = name;
      drawn = { viseme: name, turnId, time: now };
      lab.mouthHistory.push(drawn);
      capped(lab.mouthHistory);
    }
    requestAnimationFrame(animate);
  }

  // ---- the microphone: mono int16 chunks from an AudioWorklet, as binary frames ----

  let mic = null;              // the AudioWorkletNode, once the microphone is open
  let pressed = false;          // the talk button is held (push to talk) or on (hands-free)
  let talking = false;          // ... and the microphone is open: chunks are sent
  let chunksThisPress = 0;
  let voiceTurn = null;        // the push-to-talk turn whose transcript may still come
  let heard = [];              // final transcripts before the push-to-talk commit
  const SPOKEN = '(spoken)';   // a push-to-talk turn's text until its transcript comes

  function setMic(text) { lab.mic = text; $('mic').textContent = text === 'on' ? '' : text; }

  async function openMic() {
    if (mic) return true;
    if (!navigator.mediaDevices?.getUserMedia || !audio.audioWorklet) {
      setMic('Microphone unavailable: it needs a secure page (http://127.0.0.1 or localhost) '
        + 'and a browser with getUserMedia and AudioWorklet. Typing still works.');
      return false;
    }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true } });
      await audio.audioWorklet.addModule('/lab/mic-worklet.js');
      const node = new AudioWorkletNode(audio, 'mic-capture', { numberOfOutputs: 0 });
      node.port.onmessage = (ev) => {
        if (talking && send(ev.data)) {
          lab.micChunks++;
          lab.micChunkBytes = ev.data.byteLength;
          chunksThisPress++;
        }
      };
      audio.createMediaStreamSource(stream).connect(node);
      mic = node;
      setMic('on');
      return true;
    } catch (err) {
      setMic(`Microphone unavailable (${err.name === 'NotAllowedError' ? 'permission refused'
        : err.message}). Typing still works.`);
      return false;
    }
  }

  const handsFree = () => $('mic-mode').value === 'auto';

  async function startTalking() {
    resumeAudio();
    pressed = true;
    if (!(await openMic()) || !pressed || !lab.connected) return;
    talking = true;
    chunksThisPress = 0;
    $('talk').setAttribute('aria-pressed', 'true');
  }

  function stopTalking(commit = true) {
    pressed = false;
    if (!talking) return;
    talking = false;
    $('talk').setAttribute('aria-pressed', 'false');
    if (commit && !handsFree() && chunksThisPress > 0 && send({ type: 'commit' })) {
      voiceTurn = newTurn(heard.join(' ') || SPOKEN, performance.now());
      pending.push(voiceTurn);
      heard = [];
    }
  }

  function onTranscript(m) {
    lab.transcripts.push({ text: m.text, isInterim: !!m.isInterim, turnId: m.turnId });
    capped(lab.transcripts);
    if (m.isInterim) { $('interim').textContent = m.text; return; }
    $('interim').textContent = '';
    logEvent('transcript', `heard: ${m.text}`);
    if (handsFree()) {          // the server starts the turn on it: timings count from here
      pending.push(newTurn(m.text, performance.now()));
    } else if (voiceTurn && voiceTurn.turnId == null) {
      voiceTurn.said = voiceTurn.said === SPOKEN ? m.text : `${voiceTurn.said} ${m.text}`;
      views.get(voiceTurn).li.firstChild.textContent = voiceTurn.said;
    } else heard.push(m.text);
  }

  // ---- the page ----

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    node.className = cls;
    node.textContent = text;
    return node;
  }

  function capped(list) { if (list.length > CAP) list.splice(0, list.length - CAP); }

  function logEvent(kind, text) {
    const list = $('events');
    list.append(el('li', kind, text));
    while (list.children.length > EVENT_LINES) list.firstChild.remove();
    list.scrollTop = list.scrollHeight;
  }

  function divider(text) {
    const li = el('li', 'timing', `— ${text} —`);
    $('turns').append(li);
  }

  function say(text) {
    if (!text.trim() || !ws || ws.readyState !== WebSocket.OPEN) return;
    resumeAudio();
    pending.push(newTurn(text, performance.now()));
    send({ type: 'token', text });
    if (!text.startsWith('#')) send({ type: 'commit' });   // a trigger is a turn of its own
  }

  function pickAgent(name) {
    lab.agent = name;
    const agent = agents.find((a) => a.name === name) || {};
    $('agent-info').textContent = [agent.description,
      agent.speaks ? 'speaks' : 'text only',
      agent.listens ? 'listens (server-side recognition)' : 'no server-side recognition'
    ].filter(Boolean).join(' · ');
    $('actions').replaceChildren(...(agent.actions || []).map((trigger) => {
      const b = el('button', 'action', trigger);
      b.type = 'button';
      b.onclick = () => say(trigger);
      return b;
    }));
    connect();
  }

  function talkLabel() {
    $('talk').textContent = handsFree() ? 'Listen (hands-free)' : 'Hold to talk';
  }

  async function start() {
    $('reconnect').onclick = () => connect();
    $('say').onsubmit = (ev) => {
      ev.preventDefault();
      say($('text').value);
      $('text').value = '';
    };
    $('agent').onchange = () => pickAgent($('agent').value);
    $('mic-mode').onchange = () => { talkLabel(); connect(); };
    const talk = $('talk');
    talk.onpointerdown = () => { if (!handsFree()) startTalking(); };
    talk.onpointerup = talk.onpointerleave = talk.onpointercancel = () => {
      if (!handsFree()) stopTalking();
    };
    const talkKey = (ev) => (ev.key === ' ' || ev.key === 'Enter') && !handsFree();
    talk.onkeydown = (ev) => {
      if (talkKey(ev)) ev.preventDefault();        // no click: the release is the keyup
      if (talkKey(ev) && !ev.repeat) startTalking();
    };
    talk.onkeyup = (ev) => { if (talkKey(ev)) stopTalking(); };
    talk.onclick = () => { if (handsFree()) (talking ? stopTalking(false) : startTalking()); };
    document.addEventListener('pointerdown', resumeAudio);
    talkLabel();
    requestAnimationFrame(animate);
    try {
      const res = await fetch('/agents');
      const data = await res.json();
      agents = data.agents;
      $('agent').replaceChildren(...agents.map((a) => new Option(a.name, a.name)));
      const wanted = new URLSearchParams(location.search).get('agent');
      const name = agents.some((a) => a.name === wanted) ? wanted : data.default;
      $('agent').value = name;
      pickAgent(name);
    } catch (err) {
      setState(`cannot list the agents: ${err.message}`, 'closed');
    }
  }

  start();
})();
