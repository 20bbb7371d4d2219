"""The export's one error type: the export failed or did not validate; the message is one line saying why."""
from __future__ import annotations

__all__ = ["ExportError"]


class ExportError(RuntimeError):
    """The export failed or did not validate; one line says why."""
