// The Dialog Lab's microphone tap (an AudioWorklet module): the input mixed to mono and
// posted as 20 ms chunks of int16 little-endian PCM at the AudioContext's rate, which the
// page sends as binary WebSocket frames (the connection's `audioSampleRate`).
class MicCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.samples = Math.round(sampleRate / 50);
    this.fresh();
  }

  fresh() {
    this.chunk = new ArrayBuffer(this.samples * 2);
    this.view = new DataView(this.chunk);       // DataView: little-endian whatever the CPU
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;   // no source connected yet
    for (let i = 0; i < channels[0].length; i++) {
      let s = 0;
      for (const channel of channels) s += channel[i];
      s = Math.max(-1, Math.min(1, s / channels.length));
      this.view.setInt16(this.filled * 2, Math.round(s < 0 ? s * 32768 : s * 32767), true);
      if (++this.filled === this.samples) {
        this.port.postMessage(this.chunk, [this.chunk]);
        this.fresh();
      }
    }
    return true;
  }
}

registerProcessor('mic-capture', MicCapture);
