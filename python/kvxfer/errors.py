"""Exceptions carrying the status code, its name and the failing call's
message (the library's last_error, read on the same thread at once)."""


class KvxError(Exception):
    """A kvxfer call failed. ``status`` (negative int), ``name``
    ("KVX_ERR_..."), ``message`` (names the field, the value and the rule)."""

    def __init__(self, status, name, message, call=None):
        self.status = status
        self.name = name
        self.message = message
        self.call = call
        super().__init__("%s%s: %s" % (call + ": " if call else "", name,
                                       message))


class ConfigError(KvxError):
    """Argument / configuration errors (-1..-19)."""


class PeerError(KvxError):
    """Peer and control-plane errors (-20..-39)."""


class TransferError(KvxError):
    """Transfer and data-plane errors (-40..-59)."""


class InternalError(KvxError):
    """Internal errors (-90 and below)."""


class KvxTimeout(KvxError, TimeoutError):
    """A wait's deadline passed (KVX_ERR_TIMEOUT, KVX_ERR_TRANSFER_TIMEOUT,
    KVX_ERR_HANDSHAKE_TIMEOUT)."""


class TransferFailed(KvxError):
    """A transfer ended with a FAILED event; ``event`` has the blocks to
    recompute (D) or free (P)."""

    def __init__(self, event):
        self.event = event
        super().__init__(event.status, event.status_name, event.reason,
                         "transfer " + event.transfer_id)


_TIMEOUTS = {-22, -27, -41}


def error_class(status):
    if status in _TIMEOUTS:
        return KvxTimeout
    if -19 <= status <= -1:
        return ConfigError
    if -39 <= status <= -20:
        return PeerError
    if -59 <= status <= -40:
        return TransferError
    if status <= -90:
        return InternalError
    return KvxError
