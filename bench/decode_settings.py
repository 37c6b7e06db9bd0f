"""The LLM's decode settings side by side on this CPU: dtype (float32 /
bfloat16), eager vs compiled (``enforce_eager``), and OpenMP thread binding
(``VLLM_CPU_OMP_THREADS_BIND``), each in a fresh process with vLLM's offline
``LLM`` on the prepared SmolLM2-135M-Instruct.

Per setting: engine start, time to first token (``max_tokens=1``), decode
speed (greedy, 48 tokens) over spoken-style questions and ms per engine step
with 1, 4 and 8 requests decoding at once (64 tokens each: several sessions
answering), and the answers. Correctness: greedy answers are compared with
the float32/eager baseline's (same text), and each must contain the expected
word ("Paris"...). The figures print beside the baseline as ratios; nothing
is asserted. The row the engine would choose on this machine
(``domain/machine.py``: its dtype and core binding) is marked ``<- machine``.

    .venv/bin/python bench/decode_settings.py [--settings all|f32-eager,bf16-eager,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

QUESTIONS = (("What is the capital of France?", "paris"), ("What is the largest ocean?", "pacific"),
             ("What is the capital of Italy?", "rome"), ("How many legs does a spider have?", "eight|8"))
SYSTEM = "You are a helpful voice assistant. Answer in one short sentence."
SETTINGS = {  # bind None: vLLM's own ("auto": all cores but one, on two cores the second)
    "f32-eager": {"dtype": "float32", "enforce_eager": True, "bind": None},
    "bf16-eager": {"dtype": "bfloat16", "enforce_eager": True, "bind": None},
    "f16-eager": {"dtype": "float16", "enforce_eager": True, "bind": None},
    "f32-compiled": {"dtype": "float32", "enforce_eager": False, "bind": None},
    "f32-eager-bind": {"dtype": "float32", "enforce_eager": True, "bind": "0-1"},
    "bf16-eager-bind": {"dtype": "bfloat16", "enforce_eager": True, "bind": "0-1"},
}


def child(setting: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm_duplex.assets.prepare import prepared_model_dir

    t0 = time.monotonic()
    llm = LLM(model=str(prepared_model_dir()), dtype=setting["dtype"],
              enforce_eager=setting["enforce_eager"], max_model_len=2048, seed=0)
    start_s = time.monotonic() - t0
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": q}],
                                       tokenize=False, add_generation_prompt=True)
               for q, _ in QUESTIONS]
    one, full = SamplingParams(max_tokens=1, temperature=0.0), SamplingParams(
        max_tokens=48, temperature=0.0)
    llm.generate(prompts[:1], full, use_tqdm=False)  # warm-up
    ttft, tps, answers = [], [], []
    for p in prompts:
        for _ in range(3):
            t = time.monotonic()
            llm.generate([p], one, use_tqdm=False)
            ttft.append(time.monotonic() - t)
        t = time.monotonic()
        out = llm.generate([p], full, use_tqdm=False)[0].outputs[0]
        dt = time.monotonic() - t
        tps.append(len(out.token_ids) / dt)
        answers.append(out.text.strip())
    step_ms = {}
    fixed = SamplingParams(max_tokens=64, min_tokens=64, temperature=0.0, ignore_eos=True)
    for batch in (1, 4, 8):
        batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
        t = time.monotonic()
        llm.generate(batch_prompts, fixed, use_tqdm=False)
        step_ms[batch] = (time.monotonic() - t) / 64 * 1000
    print("RESULT " + json.dumps({"start_s": start_s, "ttft_ms": statistics.median(ttft) * 1000,
                                  "tok_s": statistics.median(tps), "step_ms": step_ms,
                                  "answers": answers}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="all")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(SETTINGS[args.child])
        return
    names = list(SETTINGS) if args.settings == "all" else args.settings.split(",")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lib import machine
    from vllm_duplex.domain.machine import choose, detect

    print(machine.line(), flush=True)
    chosen = choose(detect(), os.environ)
    results: dict[str, dict] = {}
    for name in names:
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1",
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        if SETTINGS[name]["bind"]:
            env["VLLM_CPU_OMP_THREADS_BIND"] = SETTINGS[name]["bind"]
        print(f"[{name}] ...", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--child", name], env=env,
                              capture_output=True, text=True, timeout=900)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            results[name] = {"error": " | ".join(tail)}
            print(f"  failed: {results[name]['error']}", flush=True)
            continue
        results[name] = json.loads(line[len("RESULT "):])
        print(f"  {results[name]}", flush=True)
    base = results.get(names[0], {})
    print(f"\n{'setting':16s} {'start s':>8s} {'TTFT ms':>8s} {'x base':>7s} {'tok/s':>7s} "
          f"{'x base':>7s} {'ms/step at 1/4/8':>18s}  same answers as {names[0]} / right")
    for name in names:
        r = results[name]
        if "error" in r:
            print(f"{name:16s} failed: {r['error'][:90]}")
            continue
        same = sum(a == b for a, b in zip(r["answers"], base.get("answers", [])))
        right = sum(any(w in a.lower() for w in exp.split("|"))  # "eight" or "8"
                    for a, (_, exp) in zip(r["answers"], QUESTIONS))
        steps = "/".join(f"{r['step_ms'][str(b)]:.0f}" for b in (1, 4, 8))
        setting = SETTINGS[name]
        mine = (setting["dtype"] == chosen.llm_dtype.value and setting["enforce_eager"]
                and setting["bind"] is None)
        print(f"{name:16s} {r['start_s']:8.1f} {r['ttft_ms']:8.1f} "
              f"{r['ttft_ms'] / base['ttft_ms']:7.2f} {r['tok_s']:7.1f} {r['tok_s'] / base['tok_s']:7.2f}"
              f" {steps:>18s}  {same}/{len(QUESTIONS)} / {right}/{len(QUESTIONS)}"
              + ("  <- machine" if mine else ""))


if __name__ == "__main__":
    main()
