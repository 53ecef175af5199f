"""Live models: forward hooks that record activations into a run (recorder), and sending them to a server (upload)."""
