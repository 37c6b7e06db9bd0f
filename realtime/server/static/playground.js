// The vllm-duplex playground: one page, no build step, nothing from elsewhere.
// Two transports, one event handler:
// - WebRTC (the default): the page mints an ephemeral key with the API key
//   (POST /v1/realtime/client_secrets, as an app's backend would), offers a
//   call (POST /v1/realtime/calls): the microphone on an Opus track (the
//   browser's echo cancellation), the reply on the answer's track, the events
//   on the oai-events data channel; the server stops the track when the user
//   speaks (output_audio_buffer.cleared).
// - WebSocket (?transport=websocket): microphone -> AudioWorklet (PCM16 at the
//   session rate) -> /v1/realtime; reply audio -> AudioWorklet, stopped the
//   moment the user speaks or the reply is cancelled; what was actually played
//   goes back as conversation.item.truncate. The key travels in the socket's
//   subprotocol (browsers cannot set headers); a dropped socket resumes.
// `window.duplex` holds what the page shows (the browser test reads it).
"use strict";

const RATE = 24000;  // the Realtime default; the AudioContext runs at it so the browser resamples
const $ = (id) => document.getElementById(id);
const state = window.duplex = {
  status: "idle", problem: null, sessionId: null, resumes: 0, connected: false,
  received: [], sent: [], userFinal: [], assistant: {}, truncates: [],
  playedSamples: 0, stops: [], gapMs: null, ttfaMs: null, scene: null,
};
let ws = null, ctx = null, mic = null, camera = null, capture = null, playback = null;
let pc = null, dc = null, statsTimer = null;  // the WebRTC call
const rtc = () => $("transport").value === "webrtc";
let resumeToken = null, lastSeq = 0, intentional = false, refused = false, frameTimer = null;
let stoppedAt = null, gapPending = false, ttfaPending = false, playingItem = null;

function setStatus(text) { state.status = text; $("status").textContent = text; }
function showProblem(text) {
  state.problem = text;
  const box = $("problem");
  box.textContent = text;
  box.hidden = !text;
}
function log(dir, event) {
  const li = document.createElement("li");
  li.textContent = `${dir} ${event.type}${event.error ? " " + event.error.code + ": " + event.error.message : ""}`;
  const list = $("log");
  list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}
function send(event) {
  const text = JSON.stringify(event);
  if (dc) {
    if (dc.readyState !== "open") return;
    // a message over the channel's limit would fail the whole channel
    if (pc.sctp && text.length > pc.sctp.maxMessageSize) return;
    dc.send(text);
  } else {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    ws.send(text);
  }
  const bulky = event.type === "input_audio_buffer.append" || event.type === "duplex.video.frame";
  state.sent.push(bulky ? event.type : event);  // audio and frames by name only
  if (event.type !== "input_audio_buffer.append" && event.type !== "duplex.video.frame") log("→", event);
}
function b64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}
function pcmFromB64(data) {
  const bin = atob(data);
  const out = new Float32Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 0x8000;
  }
  return out;
}

// ---- audio ---------------------------------------------------------------------------

async function startAudio() {
  ctx = new AudioContext({ sampleRate: RATE });
  await ctx.audioWorklet.addModule("static/capture-worklet.js");
  await ctx.audioWorklet.addModule("static/playback-worklet.js");
  playback = new AudioWorkletNode(ctx, "playback", { outputChannelCount: [1] });
  playback.connect(ctx.destination);
  playback.port.onmessage = (e) => onPlayback(e.data);
  capture = new AudioWorkletNode(ctx, "capture");
  ctx.createMediaStreamSource(mic).connect(capture);
  const mute = ctx.createGain();  // the graph is pulled from the destination: connect, silently
  mute.gain.value = 0;
  capture.connect(mute).connect(ctx.destination);
  capture.port.onmessage = (e) => send({ type: "input_audio_buffer.append", audio: b64(e.data) });
  await ctx.resume();
}

function onPlayback(m) {
  if (m.total !== undefined) {
    state.playedSamples = m.total;
    $("played").textContent = (m.total / ctx.sampleRate).toFixed(1) + " s";
  }
  if (m.type === "started") {
    playingItem = m.item;
    if (gapPending && stoppedAt !== null) {  // end of the user's speech -> first sound heard
      gapPending = false;
      state.gapMs = Math.round(performance.now() - stoppedAt);
      $("gap").textContent = state.gapMs + " ms";
    }
  } else if (m.type === "stopped") {
    state.stops.push({ item: m.item, played: m.played, at: performance.now() });
    if (m.item && m.played > 0) {  // tell the server what the user actually heard
      const ms = Math.floor(1000 * m.played / ctx.sampleRate);
      state.truncates.push({ item: m.item, audio_end_ms: ms });
      send({ type: "conversation.item.truncate", item_id: m.item, content_index: 0, audio_end_ms: ms });
    }
    playingItem = null;
  } else if (m.type === "drained") {
    playingItem = null;
  }
}

function stopPlayback() {
  if (playback) playback.port.postMessage({ type: "stop" });
}

// ---- camera --------------------------------------------------------------------------

async function startCamera() {
  camera = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  const video = $("preview");
  video.srcObject = camera;
  await video.play();
  const canvas = document.createElement("canvas");
  frameTimer = setInterval(() => {  // 1 frame/s: the server samples to 2/s anyway
    if (!video.videoWidth) return;
    const scale = dc ? Math.min(1, 320 / video.videoWidth) : 1;  // a call's channel takes 64 KiB a message
    canvas.width = Math.round(video.videoWidth * scale);
    canvas.height = Math.round(video.videoHeight * scale);
    canvas.getContext("2d").drawImage(video, 0, 0, canvas.width, canvas.height);
    canvas.toBlob(async (blob) => {
      if (blob) send({ type: "duplex.video.frame", image: b64(await blob.arrayBuffer()),
                       timestamp_ms: Math.round(performance.now()) });
    }, "image/jpeg", 0.8);
  }, 1000);
}

// ---- the socket ----------------------------------------------------------------------

function socketUrl(resume) {
  const url = new URL("v1/realtime", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (resume) url.searchParams.set("resume", "1");
  return url.href;
}

function openSocket(resume) {
  const key = $("key").value.trim();
  const protocols = ["realtime"];
  if (key) protocols.push("openai-insecure-api-key." + key);
  ws = new WebSocket(socketUrl(resume), protocols);
  ws.onopen = () => {
    if (resume) send({ type: "session.resume", session_id: state.sessionId, resume_token: resumeToken,
                       last_seq: lastSeq });
  };
  ws.onmessage = (e) => onEvent(JSON.parse(e.data));
  ws.onclose = (e) => onClose(e);
}

// ---- the call (WebRTC) -------------------------------------------------------------------

async function mintKey() {
  const key = $("key").value.trim();
  const r = await fetch("v1/realtime/client_secrets", { method: "POST",
    headers: { "Content-Type": "application/json", ...(key ? { Authorization: "Bearer " + key } : {}) },
    body: JSON.stringify({ expires_after: { anchor: "created_at", seconds: 60 } }) });
  const body = await r.json();
  if (!r.ok) throw Object.assign(new Error(body.error.message), { code: body.error.code });
  return body.value;
}

async function openCall() {
  const ek = await mintKey();
  pc = new RTCPeerConnection();
  dc = pc.createDataChannel("oai-events");
  dc.onmessage = (e) => onEvent(JSON.parse(e.data));
  dc.onclose = () => onClose({ code: 1000, reason: "hangup" });
  pc.addTrack(mic.getAudioTracks()[0], mic);
  pc.ontrack = (e) => { $("reply").srcObject = e.streams[0] || new MediaStream([e.track]); };
  pc.onconnectionstatechange = () => {
    if (pc && pc.connectionState === "failed") onClose({ code: 1006, reason: "the call failed" });
  };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {  // the offer with its candidates (or what 2 s gathered)
    if (pc.iceGatheringState === "complete") return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && done();
    setTimeout(done, 2000);
  });
  const r = await fetch("v1/realtime/calls", { method: "POST", body: pc.localDescription.sdp,
    headers: { "Content-Type": "application/sdp", Authorization: "Bearer " + ek } });
  if (!r.ok) {
    const body = await r.json();
    throw Object.assign(new Error(body.error.message), { code: body.error.code });
  }
  state.callId = r.headers.get("Location").split("/").pop();
  await pc.setRemoteDescription({ type: "answer", sdp: await r.text() });
  replyTrack.played = 0;
  replyTrack.from = null;
  statsTimer = setInterval(() => readReplyTrack("poll"), 250);
}

// A call's reply track runs all call long, silence between replies, so its stats
// count only inside a reply: "played" is the track's time from
// output_audio_buffer.started to .stopped / .cleared (its whole time counted the
// silence: 39.7 s "played" for a 2 s answer), and the turn gap ends when the
// track's energy rises after .started, the reply's first sound played out (TTFA
// ends at .started itself: the first audio reached the page).
const replyTrack = { played: 0, from: null, energyFrom: 0 };  // seconds of earlier replies; the track's seconds and energy at this one's start
let trackReads = Promise.resolve();  // stats reads, in the order of the events that asked

function readReplyTrack(mark, then) {  // mark: "start" | "end" | "poll"
  trackReads = trackReads.then(async () => {
    if (!pc) return;
    let track = null;
    (await pc.getStats()).forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") track = s; });
    if (!track) return;
    const seconds = track.totalSamplesDuration || 0, energy = track.totalAudioEnergy || 0;
    const played = replyTrack.played + (replyTrack.from === null ? 0 : seconds - replyTrack.from);
    if (mark === "start" && replyTrack.from === null) {
      replyTrack.from = seconds;
      replyTrack.energyFrom = energy;
    } else if (mark === "end" && replyTrack.from !== null) {
      replyTrack.played = played;
      replyTrack.from = null;
    }
    state.playedSamples = Math.round(played * RATE);
    $("played").textContent = played.toFixed(1) + " s";
    if (gapPending && stoppedAt !== null && replyTrack.from !== null && energy > replyTrack.energyFrom) {
      gapPending = false;  // end of the user's speech -> the reply's first sound played
      state.gapMs = Math.round(performance.now() - stoppedAt);
      $("gap").textContent = state.gapMs + " ms";
    }
    if (then) then();
  }).catch(() => {});  // the call closed under the read
}

function awaitFirstSound() {  // every 20 ms from .started until the reply is heard or ends
  if (pc && gapPending && replyTrack.from !== null) readReplyTrack("poll", () => setTimeout(awaitFirstSound, 20));
}

function configure() {
  if (dc) {  // a call's audio is Opus on its tracks: only how turns are taken
    send({ type: "session.update", session: { type: "realtime", audio: {
      input: { transcription: { model: "default" }, turn_detection: { type: "server_vad" } } } } });
    return;
  }
  const rate = ctx.sampleRate;
  send({ type: "session.update", session: { type: "realtime", audio: {
    input: { format: { type: "audio/pcm", rate }, transcription: { model: "default" },
             turn_detection: { type: "server_vad" } },
    output: { format: { type: "audio/pcm", rate } } } } });
}

function assistantLine(responseId) {
  let entry = state.assistant[responseId];
  if (!entry) {
    const li = document.createElement("li");
    $("assistant").append(li);
    entry = state.assistant[responseId] = { text: "", li };
  }
  return entry;
}

const PROBLEMS = {
  unauthorized: "The server refused the API key. Enter the key it was started with.",
  resource_exhausted: "The server is full (resource_exhausted). Try again in a moment.",
  session_expired: "The session expired before it could be resumed. Connect again.",
  session_not_found: "The session is gone. Connect again.",
  client_secret_expired: "The call's key expired before it was used. Connect again.",
};

function onEvent(event) {
  state.received.push(event.type);
  if (typeof event.seq === "number") lastSeq = Math.max(lastSeq, event.seq);
  if (!event.type.endsWith(".delta")) log("←", event);
  switch (event.type) {
    case "session.created":
      state.sessionId = event.session.id;
      resumeToken = event.resume_token;
      state.connected = true;
      $("session").textContent = event.session.id;
      $("model").textContent = event.session.model;
      configure();
      setStatus("Listening. Speak!");
      break;
    case "session.resumed":
      resumeToken = event.resume_token;
      state.resumes += 1;
      state.connected = true;
      showProblem(null);
      setStatus("Reconnected: the session resumed where it was.");
      break;
    case "output_audio_buffer.started":  // a call: the server began sending the reply's audio
      if (ttfaPending && stoppedAt !== null) {
        ttfaPending = false;
        state.ttfaMs = Math.round(performance.now() - stoppedAt);
        $("ttfa").textContent = state.ttfaMs + " ms";
      }
      readReplyTrack("start", awaitFirstSound);
      break;
    case "output_audio_buffer.stopped":  // a call: the reply's audio is all sent
      readReplyTrack("end");
      break;
    case "output_audio_buffer.cleared": {  // a call: the server stopped the reply's track
      const at = performance.now();
      readReplyTrack("end", () => state.stops.push({ item: null, played: state.playedSamples, at }));
      break;
    }
    case "input_audio_buffer.speech_started":
      stopPlayback();  // barge-in: silence now; the server cancels the reply
      $("partial").textContent = "…";
      break;
    case "input_audio_buffer.speech_stopped":
      stoppedAt = performance.now();
      gapPending = ttfaPending = true;
      break;
    case "conversation.item.input_audio_transcription.delta":
      $("partial").textContent = ($("partial").textContent.replace("…", "") + event.delta);
      break;
    case "conversation.item.input_audio_transcription.completed": {
      state.userFinal.push(event.transcript);
      $("partial").textContent = "";
      const li = document.createElement("li");
      li.textContent = event.transcript || "(nothing heard)";
      $("user").append(li);
      break;
    }
    case "response.output_audio.delta":
      if (ttfaPending && stoppedAt !== null) {
        ttfaPending = false;
        state.ttfaMs = Math.round(performance.now() - stoppedAt);
        $("ttfa").textContent = state.ttfaMs + " ms";
      }
      playback.port.postMessage({ type: "chunk", item: event.item_id, samples: pcmFromB64(event.delta) });
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const entry = assistantLine(event.response_id);
      entry.text += event.delta;
      entry.li.textContent = entry.text;
      break;
    }
    case "response.done":
      if (event.response.status === "cancelled" && event.response.status_details
          && event.response.status_details.reason === "client_cancelled") stopPlayback();
      break;
    case "duplex.video.scene":
      state.scene = event.text;
      $("scene").textContent = event.text || "(nothing recognised)";
      break;
    case "error": {
      const code = event.error && event.error.code;
      if (PROBLEMS[code]) {
        refused = true;
        showProblem(PROBLEMS[code]);
      }
      break;
    }
  }
}

function onClose(e) {
  state.connected = false;
  if (intentional) { setStatus("Hung up."); return; }
  if (refused || e.code === 1008 || e.code === 1013) {
    if (!state.problem) showProblem(`The server closed the connection: ${e.reason || e.code}.`);
    setStatus("Not connected.");
    teardown();
    return;
  }
  if (pc) {  // a call has no resume: its session ended with it
    showProblem(`The call ended (${e.reason || e.code}).`);
    setStatus("Not connected.");
    teardown();
    return;
  }
  if (state.sessionId && resumeToken && state.resumes < 5) {  // dropped: resume the session
    setStatus("Connection lost; resuming…");
    showProblem("Connection lost. Resuming the session…");
    setTimeout(() => openSocket(true), 300);
    return;
  }
  showProblem(`Disconnected (${e.code}${e.reason ? ": " + e.reason : ""}).`);
  teardown();
}

function teardown() {
  clearInterval(frameTimer);
  clearInterval(statsTimer);
  if (dc) dc.onclose = null;
  if (pc) { pc.onconnectionstatechange = null; pc.close(); }
  pc = dc = null;
  for (const stream of [mic, camera]) if (stream) stream.getTracks().forEach((t) => t.stop());
  mic = camera = null;
  if (ctx) ctx.close();
  ctx = null;
  $("connect").disabled = false;
  $("hangup").disabled = true;
}

async function connect() {
  showProblem(null);
  intentional = refused = false;
  state.resumes = 0;
  $("connect").disabled = true;
  if (!window.isSecureContext || !navigator.mediaDevices) {
    showProblem("This page needs a secure context for the microphone: open it over https or on 127.0.0.1 / localhost.");
    $("connect").disabled = false;
    return;
  }
  try {
    // Echo cancellation keeps the reply coming out of the speakers from barging in on
    // itself; noise suppression and gain control are left to the server's VAD and ASR,
    // whose recognition their artefacts hurt.
    mic = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true,
                                                               noiseSuppression: false,
                                                               autoGainControl: false } });
  } catch (err) {
    showProblem(`No microphone: ${err.name === "NotAllowedError" ? "access was denied. Allow the microphone for this page and connect again." : err.message}`);
    $("connect").disabled = false;
    return;
  }
  try {
    if (!rtc()) await startAudio();  // a call sends and plays its audio on its tracks
    if ($("camera").checked) await startCamera();
  } catch (err) {
    showProblem(`Cannot start audio or camera: ${err.message}`);
    teardown();
    return;
  }
  $("hangup").disabled = false;
  localStorage.setItem("duplex-key", $("key").value);
  setStatus("Connecting…");
  if (!rtc()) {
    openSocket(false);
    return;
  }
  try {
    await openCall();
  } catch (err) {
    refused = true;
    showProblem(PROBLEMS[err.code] || `The call could not start: ${err.message}`);
    setStatus("Not connected.");
    teardown();
  }
}

function hangUp() {
  intentional = true;
  send({ type: "session.close" });
  if (ws) ws.close(1000);
  teardown();
  setStatus("Hung up.");
}

$("key").value = localStorage.getItem("duplex-key") || "";
const asked = new URLSearchParams(location.search).get("transport");
if (asked === "websocket" || asked === "webrtc") $("transport").value = asked;
$("connect").onclick = connect;
$("hangup").onclick = hangUp;
// For tests and for trying resume by hand: drop the socket as a network failure would.
state.dropSocket = () => ws && ws.close(4000, "dropped for a test");
