"""Test and demo support: tiny random HF models built in code (no downloads, nothing committed)."""
