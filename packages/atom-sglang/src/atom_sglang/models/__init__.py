"""ATOM's SGLang model package (what ``SGLANG_EXTERNAL_MODEL_PACKAGE`` would name).

SGLang's registry imports every module of this package and registers its ``EntryClass`` under each
class's name; :mod:`atom_sglang.register` hands the package to the registry at plugin load.
"""
