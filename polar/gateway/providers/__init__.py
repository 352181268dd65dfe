"""One module per provider API: ``parse_request``, ``response``, ``stream`` and ``error_body``."""
