"""Loading libkvxfer and reading its versioned function table with ctypes.

The library exports one symbol, ``kvx_get_api``; everything else is reached
through the table it returns.  The table is copied only up to its
``struct_size`` (never past it): members a older library lacks read as NULL
and the methods that need them raise ``KvxError(KVX_ERR_NOT_SUPPORTED)``.
"""
import ctypes
import os
import threading

ABI_MAJOR = 1
ABI_MINOR = 3  # the table this binding knows (include/kvxfer/kvxfer.h)
ID_MAX = 256
REASON_MAX = 512

_c_status = ctypes.c_int
_eng = ctypes.c_void_p
_strp = ctypes.POINTER(ctypes.c_void_p)  # char ** out-parameter
_u64p = ctypes.POINTER(ctypes.c_uint64)


class LayerDesc(ctypes.Structure):
    """kvx_layer_desc_t."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("base", ctypes.c_void_p),
        ("length", ctypes.c_size_t),
        ("mem_type", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * 8),
        ("stride", ctypes.c_int64 * 8),
        ("elem_size", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_size", ctypes.c_uint32),
        ("head_size_v", ctypes.c_uint32),
        ("key_only", ctypes.c_uint32),
    ]


class CEvent(ctypes.Structure):
    """kvx_event_t."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("status", _c_status),
        ("transfer_id", ctypes.c_char * ID_MAX),
        ("request_id", ctypes.c_char * ID_MAX),
        ("reason", ctypes.c_char * REASON_MAX),
        ("block_ids", _u64p),
        ("num_block_ids", ctypes.c_size_t),
    ]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                          ctypes.c_char_p, ctypes.c_char_p)
F = ctypes.CFUNCTYPE

# (member, restype, argtypes, minor that added it), in table order.
_MEMBERS = [
    ("status_name", ctypes.c_char_p, [_c_status], 0),
    ("status_string", ctypes.c_char_p, [_c_status], 0),
    ("last_error", ctypes.c_char_p, [], 0),
    ("free", None, [ctypes.c_void_p], 0),
    ("set_logger", None, [LOG_FN, ctypes.c_void_p, ctypes.c_int], 0),
    ("engine_create", _c_status, [ctypes.c_char_p, ctypes.POINTER(_eng)], 0),
    ("engine_destroy", None, [_eng], 0),
    ("config_dump", _c_status, [_eng, _strp], 0),
    ("alloc_region", _c_status,
     [_eng, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)], 0),
    ("free_region", _c_status, [_eng, ctypes.c_void_p], 0),
    ("register_layer", _c_status, [_eng, ctypes.POINTER(LayerDesc)], 0),
    ("start", _c_status, [_eng], 0),
    ("registration_payload", _c_status, [_eng, _strp], 0),
    ("producer_request", _c_status,
     [_eng, ctypes.c_char_p, ctypes.c_char_p, _u64p, ctypes.c_size_t, _strp],
     0),
    ("consumer_request", _c_status,
     [_eng, ctypes.c_char_p, ctypes.c_char_p, _u64p, ctypes.c_size_t], 0),
    ("wait_layer", _c_status,
     [_eng, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int64], 0),
    ("wait_transfer", _c_status, [_eng, ctypes.c_char_p, ctypes.c_int64], 0),
    ("poll_events", ctypes.c_int,
     [_eng, ctypes.POINTER(CEvent), ctypes.c_int], 0),
    ("transports", _c_status, [_eng, _strp], 0),
    ("build_decode_params", _c_status,
     [ctypes.c_char_p, ctypes.c_char_p, _strp], 0),
    # ABI 1.1
    ("layer_ready", _c_status, [_eng, ctypes.c_char_p, ctypes.c_uint32], 1),
    ("seal_transfer", _c_status, [_eng, ctypes.c_char_p], 1),
    ("consumer_abort", _c_status,
     [_eng, ctypes.c_char_p, ctypes.c_char_p], 1),
    ("stats", _c_status, [_eng, _strp], 1),
    ("build_prefill_params", _c_status,
     [ctypes.c_char_p, ctypes.c_char_p, _strp], 1),
    # ABI 1.2
    ("connect_peer", _c_status, [_eng, ctypes.c_char_p, ctypes.c_int64], 2),
    ("wait_events", _c_status, [_eng, ctypes.c_int64], 2),
    # ABI 1.3
    ("event_fd", _c_status, [_eng, ctypes.POINTER(ctypes.c_int)], 3),
]


class _Header(ctypes.Structure):
    _fields_ = [("abi_major", ctypes.c_uint32), ("abi_minor", ctypes.c_uint32),
                ("struct_size", ctypes.c_size_t)]


class _Table(ctypes.Structure):
    _fields_ = list(_Header._fields_) + [(m[0], ctypes.c_void_p)
                                         for m in _MEMBERS]


class Api:
    """The function table of one loaded library, as Python callables.

    ``api.abi_minor``, ``api.struct_size``; ``api.has(name)`` says whether
    the library's table reaches that member; ``api.<member>(...)`` calls it.
    """

    def __init__(self, path, handle, table_ptr):
        hdr = _Header.from_address(table_ptr)
        self.path = path
        self.abi_major = hdr.abi_major
        self.abi_minor = hdr.abi_minor
        self.struct_size = hdr.struct_size
        if self.abi_major != ABI_MAJOR:
            raise ImportError("%s: table abi_major %d, binding needs %d"
                              % (path, self.abi_major, ABI_MAJOR))
        if self.struct_size < ctypes.sizeof(_Header):
            raise ImportError("%s: table struct_size %d is smaller than its "
                              "header" % (path, self.struct_size))
        # Copy exactly struct_size bytes (bounded by what this binding
        # knows); members past it stay NULL.
        n = min(self.struct_size, ctypes.sizeof(_Table))
        buf = bytearray(ctypes.sizeof(_Table))
        buf[:n] = ctypes.string_at(table_ptr, n)
        table = _Table.from_buffer_copy(bytes(buf))
        self._handle = handle  # keeps the library loaded
        self._fns = {}
        for name, res, args, _minor in _MEMBERS:
            addr = getattr(table, name)
            if addr:
                self._fns[name] = F(res, *args)(addr)

    def has(self, name):
        return name in self._fns

    def __getattr__(self, name):
        fns = self.__dict__.get("_fns", {})
        if name in fns:
            return fns[name]
        if any(m[0] == name for m in _MEMBERS):
            from .errors import KvxError
            raise KvxError(-3, "KVX_ERR_NOT_SUPPORTED",
                           "%s: not in this library's function table (ABI "
                           "1.%d, struct_size %d)" % (name, self.abi_minor,
                                                      self.struct_size))
        raise AttributeError(name)


_api = None
_api_lock = threading.Lock()

DEFAULT_NAMES = ("libkvxfer.so.1", "libkvxfer.so")


def load(path=None):
    """Load libkvxfer (once per process) and return its Api.

    Order: ``path``; the ``KVXFER_LIBRARY`` environment variable; the
    dynamic linker's search for libkvxfer.so.1.  Only ``kvx_get_api`` is
    resolved.
    """
    global _api
    with _api_lock:
        if _api is not None:
            if path is not None and os.path.realpath(path) != \
                    os.path.realpath(_api.path):
                raise ImportError("kvxfer already loaded from %s, not %s"
                                  % (_api.path, path))
            return _api
        names = [path] if path else (
            [os.environ["KVXFER_LIBRARY"]] if os.environ.get("KVXFER_LIBRARY")
            else list(DEFAULT_NAMES))
        errors = []
        for name in names:
            try:
                handle = ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise ImportError("cannot load libkvxfer (set KVXFER_LIBRARY or "
                              "pass the path): " + "; ".join(errors))
        get = handle.kvx_get_api
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.c_uint32]
        ptr = get(ABI_MAJOR)
        if not ptr:
            raise ImportError("%s: kvx_get_api(%d) returned NULL (ABI major "
                              "mismatch)" % (name, ABI_MAJOR))
        _api = Api(name, handle, ptr)
        return _api


def take_string(api, out):
    """Copies the ``char *`` a call stored in ``out`` and frees it with
    api.free (the caller owns such strings)."""
    if not out.value:
        return None
    try:
        return ctypes.string_at(out.value).decode()
    finally:
        api.free(out.value)
        out.value = None
