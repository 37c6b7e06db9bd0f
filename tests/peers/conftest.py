"""Other projects' test suites, kept as their authors wrote them (each folder's
SOURCES.md names the repository, commit and licence). They run in the clients'
virtualenv (.venv-clients) through a wrapper in tests/clients
(test_peer_*.py), never in this suite's interpreter: they import livekit and
their own conftest, which are not ours, so this suite must not collect them."""

collect_ignore_glob = ["*"]
