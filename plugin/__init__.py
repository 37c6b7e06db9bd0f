"""vllm_duplex: the duplex engine — control plane, stages and vLLM hooks.

Rooms, bottom to top (``.importlinter`` keeps every import pointing down; a
violation fails the test suite):

    core      fence, errors, clock, contracts, payloads, commands, events: pure types
    policy    the ModelPolicy protocol and its registry      replay   bounded seq logs
    media     audio and video codecs                         leases   session leases
    assets    model files from installed packages (prepared once, found by the stages)
    stages    the port protocol, pipeline, and every stage (listening, speech,
              vision, omni, vllm)
    session   one realtime session: its mailbox, responses, runner
    text      the HTTP text surfaces: generate, application sessions, streams
    host      one server process: runtime, deploy configs, stage registry
    fleet     serve --workers N: supervisor, shared engine core, nginx router, fleet view
    cli       the ``vllm-duplex`` command (serve, edge, talk, prepare), above everything
    testing   fakes and the virtual clock, for tests only: sees core, policy, models, stages

``vllm_duplex.models`` (policies) sees only core and policy; product code
imports neither models nor testing (both are found by entry point);
``vllm_duplex.realtime`` (wire, server, client) sits beside ``fleet``, below ``cli``.
"""

__version__ = "0.1.0"
