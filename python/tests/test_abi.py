"""The binding loads the library by its single entry point, checks the ABI
and never reads the function table past struct_size."""
import ctypes
import mmap
import subprocess
import sys

import pytest

import kvxfer
from kvxfer import _lib


def test_entry_point_and_abi():
    api = kvxfer.load()
    major, minor, size = kvxfer.abi()
    assert major == kvxfer.ABI_MAJOR == 1
    assert minor >= 3
    assert size == ctypes.sizeof(_lib._Table)
    for name, _res, _args, _minor in _lib._MEMBERS:
        assert api.has(name), name
    get = api._handle.kvx_get_api
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.c_uint32]
    assert get(2) is None and get(0) is None
    # Nothing but the entry point resolves.
    for sym in ("kvc_api_table", "kvx_engine_create", "kvu_post"):
        with pytest.raises(AttributeError):
            getattr(api._handle, sym)


def _table_copy_before_guard_page(api_ptr, struct_size):
    """A copy of the table's first struct_size bytes placed so that its last
    byte is followed by an inaccessible page: reading past it faults."""
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE
    at = base + page - struct_size
    ctypes.memmove(at, api_ptr, struct_size)
    hdr = _lib._Header.from_address(at)
    hdr.abi_minor = 2
    hdr.struct_size = struct_size
    return m, at


def test_older_table_is_read_only_up_to_struct_size():
    api = kvxfer.load()
    get = api._handle.kvx_get_api
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.c_uint32]
    size_12 = _lib._Table.event_fd.offset  # the 1.2 table ends here
    keep, at = _table_copy_before_guard_page(get(1), size_12)
    old = _lib.Api("copy", api._handle, at)
    assert old.abi_minor == 2 and old.struct_size == size_12
    assert old.has("wait_events") and not old.has("event_fd")
    with pytest.raises(kvxfer.KvxError) as e:
        old.event_fd(None, None)
    assert e.value.name == "KVX_ERR_NOT_SUPPORTED"
    assert "event_fd" in e.value.message and "1.2" in e.value.message
    assert old.status_name(-8) == b"KVX_ERR_ABI"
    del old, keep  # the copy's mapping lives as long as the test


def test_reading_past_struct_size_would_fault():
    """The guard-page setup above is able to catch an over-read: a
    deliberate read of one byte more crashes a child process."""
    code = (
        "import ctypes, kvxfer\n"
        "from tests.test_abi import _table_copy_before_guard_page as g\n"
        "api = kvxfer.load()\n"
        "get = api._handle.kvx_get_api\n"
        "get.restype = ctypes.c_void_p; get.argtypes = [ctypes.c_uint32]\n"
        "m, at = g(get(1), 64)\n"
        "ctypes.string_at(at, 65)\n")
    import os
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=here)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=here,
                       capture_output=True, timeout=60)
    assert r.returncode != 0, r.stderr


def test_abi_major_mismatch_is_refused(monkeypatch):
    api = kvxfer.load()
    get = api._handle.kvx_get_api
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.c_uint32]
    buf = ctypes.create_string_buffer(ctypes.string_at(get(1), 16), 16)
    _lib._Header.from_buffer(buf).abi_major = 2
    with pytest.raises(ImportError, match="abi_major 2"):
        _lib.Api("fake", api._handle, ctypes.addressof(buf))
