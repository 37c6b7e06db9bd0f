"""Remote code for the tiny models' directories (copied there by the
builders, loaded by transformers with ``trust_remote_code``): what the real
MiniCPM-o checkpoint ships as its own code, written for the tiny models."""
