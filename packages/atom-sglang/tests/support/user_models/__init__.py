"""TEST-ONLY: a user's own SGLANG_EXTERNAL_MODEL_PACKAGE, to check that it keeps precedence over ATOM."""
