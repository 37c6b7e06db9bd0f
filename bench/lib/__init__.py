"""The benches' shared parts; the scripts beside this folder (``bench/NAME.py``)
are the benches, and import each other only through here.

- ``machine``: what a bench ran on (the line every bench prints);
- ``serve_process``: a ``vllm-duplex serve`` subprocess (free port, always
  stopped), its ``/metrics`` scraped, CPU time over a window;
- ``sides``: the same bench against several trees in one run (a git worktree
  per ref, its package imported in place of this one, a server per side);
- ``turns``: one spoken question in its own realtime session, timed;
- ``voice_scenarios``: speech cut into 20 ms chunks, a realtime connection at
  real time, spoken turns and barge-in;
- ``voice_llm_ttft``: the LLM's time to first token at the end of a turn;
- ``speech_corpus``: synthetic voices, the spoken questions and QA set, word
  error rate; ``real_corpus``: recordings of people (``bench/real_voices/``);
  ``speech_qa``: the LLM half of the speech bench;
- ``churn``: session churn against a live server (also
  ``tests/integration/test_leaks.py``).

A script puts ``bench/`` on ``sys.path`` (run as ``bench/NAME.py`` it is there
already) and imports ``from lib.NAME import ...``; the modules here import each
other relatively. Flite speech, test tones and the WebRTC client come from the
tests' support code (``tests/support/``: ``speech_fixtures``, ``audio``,
``webrtc``): the modules and scripts that use it put ``tests/`` on the path
themselves. Nothing in ``tests/support/`` imports a bench; three tests import
one (``test_real_voices.py``, ``test_leaks.py``, ``test_soak.py``).
"""
