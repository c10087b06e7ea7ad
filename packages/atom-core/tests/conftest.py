from atom_core.testing.fixtures import tiny_model_dir  # noqa: F401  (shared fixture)
