"""Protocol errors: what was wrong with a message, in words a log line can carry."""


class ProtocolError(ValueError):
    """A message that must be rejected (malformed, oversized, out of range)."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version; it should be told and stop."""
