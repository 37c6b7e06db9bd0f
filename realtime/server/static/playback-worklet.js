// Reply audio: a queue of PCM chunks, each tagged with its item, played at the
// AudioContext's rate. It counts what it has actually played per item, so the
// page can tell the server exactly what was heard (conversation.item.truncate),
// and it stops at once on "stop" (barge-in, cancel), answering with that count.
class PlaybackProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];          // [{item, samples: Float32Array, offset}]
    this.played = {};         // item id -> samples played
    this.total = 0;           // all samples played (the page shows it; tests read it)
    this.current = null;
    this.quanta = 0;
    this.port.onmessage = (e) => {
      const m = e.data;
      if (m.type === "chunk") {
        this.queue.push({ item: m.item, samples: m.samples, offset: 0 });
      } else if (m.type === "stop") {
        const item = this.current;
        this.queue = [];
        this.current = null;
        this.port.postMessage({ type: "stopped", item, played: item ? this.played[item] || 0 : 0,
                                total: this.total });
      }
    };
  }
  process(inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    while (i < out.length && this.queue.length) {
      const head = this.queue[0];
      if (head.item !== this.current) {
        this.current = head.item;
        this.port.postMessage({ type: "started", item: head.item });
      }
      const n = Math.min(out.length - i, head.samples.length - head.offset);
      out.set(head.samples.subarray(head.offset, head.offset + n), i);
      head.offset += n;
      i += n;
      this.played[head.item] = (this.played[head.item] || 0) + n;
      this.total += n;
      if (head.offset === head.samples.length) this.queue.shift();
    }
    out.fill(0, i);
    if (i > 0 && ++this.quanta % 8 === 0) {  // about every 40 ms: enough for the page's meters
      this.port.postMessage({ type: "progress", item: this.current, total: this.total });
    }
    if (i === 0 && this.current !== null && !this.queue.length) {
      this.port.postMessage({ type: "drained", item: this.current, played: this.played[this.current] });
      this.current = null;
    }
    return true;
  }
}
registerProcessor("playback", PlaybackProcessor);
