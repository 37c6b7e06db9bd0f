"""The fleet: ``serve --workers N`` — N worker processes behind nginx on one
vLLM engine core, and what outlives a worker.

``supervisor`` starts and restarts the workers; ``engine_core`` shares one
vLLM engine core between them; ``router`` generates and runs nginx (owner ids
to their worker, new sessions to the least loaded); ``view`` serves the
fleet's ``/health`` and ``/metrics``; ``worker`` is the ``Runtime`` of one
worker process.

Above the host (each worker is an ordinary ``Runtime``), beside ``realtime``,
which it never imports (workers are ``vllm-duplex serve`` subprocesses), below
the CLI that starts it.
"""
