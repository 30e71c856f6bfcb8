"""kvxfer: KV-cache transfer between prefill and decode instances, from
Python (ctypes over libkvxfer's single entry point; asyncio-ready).

    import kvxfer
    with kvxfer.Engine({"role": "kv_consumer", ...}) as eng:
        eng.register_layer("layer.0", kv_tensor, block_size=16,
                           num_kv_heads=8, head_size=128)
        eng.start()
        eng.consumer_request(rid, params, block_ids)
        eng.wait_transfer(tid)
"""
from ._lib import ABI_MAJOR, ABI_MINOR, load
from .engine import Engine, Event
from .errors import (ConfigError, InternalError, KvxError, KvxTimeout,
                     PeerError, TransferError, TransferFailed)
from .proxy import build_decode_params, build_prefill_params, request_id

__all__ = ["ABI_MAJOR", "ABI_MINOR", "load", "Engine", "Event", "KvxError",
           "ConfigError", "PeerError", "TransferError", "InternalError",
           "KvxTimeout", "TransferFailed", "build_decode_params",
           "build_prefill_params", "request_id", "abi", "set_logger",
           "status_name"]
__version__ = "1.3.0"


def abi():
    """(major, minor, struct_size) of the loaded library's table."""
    api = load()
    return api.abi_major, api.abi_minor, api.struct_size


def status_name(status):
    return load().status_name(status).decode()


_logger_ref = None


def set_logger(fn, max_level=1):
    """Routes the library's log (process-wide) to ``fn(level, id, msg)``
    (levels 0 error .. 3 debug); None restores stderr. Exceptions raised by
    fn are swallowed (a C callback cannot raise). The callback may run on
    the engine's progress thread or inline in start()."""
    global _logger_ref
    from ._lib import LOG_FN
    api = load()
    if fn is None:
        api.set_logger(LOG_FN(), None, max_level)
        _logger_ref = None
        return

    def tramp(_arg, level, ident, msg):
        try:
            fn(level, (ident or b"").decode(errors="replace"),
               (msg or b"").decode(errors="replace"))
        except BaseException:  # noqa: B902 - never unwind into C
            pass

    ref = LOG_FN(tramp)
    api.set_logger(ref, None, max_level)
    _logger_ref = ref  # the C side keeps the pointer: keep the thunk alive
