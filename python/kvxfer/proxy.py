"""The proxy's helpers (no engine): kv_transfer_params as the MoRIIO proxy
builds them (SPEC §3)."""
import ctypes
import json

from . import _lib
from .engine import _check, _json_arg


def _call(name, src, transfer_id):
    api = _lib.load()
    out = ctypes.c_void_p()
    st = getattr(api, name)(_json_arg(src), transfer_id.encode(),
                            ctypes.byref(out))
    if st < 0:
        _lib.take_string(api, out)
        _check(api, st, name)
    return json.loads(_lib.take_string(api, out))


def build_decode_params(prefill_response, transfer_id):
    """From P's response params (dict or JSON), D's kv_transfer_params."""
    return _call("build_decode_params", prefill_response, transfer_id)


def build_prefill_params(decode_registration, transfer_id):
    """From D's registration payload, P's kv_transfer_params (WRITE)."""
    return _call("build_prefill_params", decode_registration, transfer_id)


def request_id(prefill_host, prefill_handshake, prefill_notify, decode_host,
               decode_handshake, decode_notify, uid):
    """The proxy's request_id format (SPEC §3)."""
    return ("___prefill_addr_host:%s,handshake:%d,notify:%d___decode_addr_"
            "host:%s,handshake:%d,notify:%d_%s"
            % (prefill_host, prefill_handshake, prefill_notify, decode_host,
               decode_handshake, decode_notify, uid))
