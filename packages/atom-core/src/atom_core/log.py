"""The ``atom`` logger: lines read ``INFO atom: ...`` whatever the host's logging setup."""

import logging
import os

_logger = logging.getLogger("atom")
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(os.environ.get("ATOM_LOG_LEVEL", "INFO"))
    _logger.propagate = False

logger = _logger
