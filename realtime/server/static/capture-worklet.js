// Microphone -> PCM16 frames of 20 ms at the AudioContext's rate (the session's
// input rate: the page makes its AudioContext at that rate, so the browser
// resamples the microphone, not us). Posts ArrayBuffers of little-endian int16.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round(sampleRate / 50);
    this.frame = new Int16Array(this.size);
    this.filled = 0;
  }
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      const s = Math.max(-1, Math.min(1, channel[i]));
      this.frame[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.filled === this.size) {
        this.port.postMessage(this.frame.buffer, [this.frame.buffer]);  // detaches this.frame
        this.frame = new Int16Array(this.size);
        this.filled = 0;
      }
    }
    return true;
  }
}
registerProcessor("capture", CaptureProcessor);
