"""Engine: one kvxfer engine (one rank) over the C function table."""
import collections
import ctypes
import json
import threading
import time

from . import _lib
from .errors import KvxError, TransferFailed, error_class

EVENT_TYPES = {1: "FINISHED_SENDING", 2: "FINISHED_RECVING", 3: "FAILED"}
MEM_TYPES = {"host": 0, "rocm": 1}

# Bytes per element of the dtypes frameworks report (torch / numpy names).
DTYPE_SIZES = {
    "float64": 8, "double": 8, "int64": 8, "uint64": 8,
    "float32": 4, "float": 4, "int32": 4, "uint32": 4,
    "float16": 2, "half": 2, "bfloat16": 2, "int16": 2, "uint16": 2,
    "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2": 1, "float8_e5m2fnuz": 1, "bool": 1,
}


class Event:
    """A transfer outcome (kvx_event_t) as a Python object. ``type`` is
    "FINISHED_SENDING", "FINISHED_RECVING" or "FAILED"; ``block_ids`` a list
    (FAILED: blocks to recompute on D / free on P)."""

    __slots__ = ("type", "status", "status_name", "transfer_id", "request_id",
                 "reason", "block_ids")

    def __init__(self, type, status, status_name, transfer_id, request_id,
                 reason, block_ids):
        self.type = type
        self.status = status
        self.status_name = status_name
        self.transfer_id = transfer_id
        self.request_id = request_id
        self.reason = reason
        self.block_ids = block_ids

    @property
    def ok(self):
        return self.type != "FAILED"

    def __repr__(self):
        return ("Event(%s, %s, transfer_id=%r, blocks=%d%s)"
                % (self.type, self.status_name, self.transfer_id,
                   len(self.block_ids),
                   ", reason=%r" % self.reason if self.reason else ""))


def _check(api, status, call):
    """Raises the KvxError of a failed call (status < 0)."""
    if status < 0:
        msg = (api.last_error() or b"").decode(errors="replace")
        name = api.status_name(status).decode()
        raise error_class(status)(status, name, msg, call)
    return status


def _json_arg(value):
    if value is None:
        return None
    if isinstance(value, (bytes, str)):
        return value.encode() if isinstance(value, str) else value
    return json.dumps(value).encode()


def _ids(block_ids):
    ids = list(block_ids)
    return (ctypes.c_uint64 * max(len(ids), 1))(*ids), len(ids)


def _elem_size(dtype):
    if isinstance(dtype, int):
        return dtype
    size = getattr(dtype, "itemsize", None)  # numpy dtype
    if isinstance(size, int):
        return size
    name = str(dtype).rsplit(".", 1)[-1]  # "torch.bfloat16" -> "bfloat16"
    if name not in DTYPE_SIZES:
        raise ValueError("dtype %r: unknown; pass elem_size (bytes) as an int"
                         % (dtype,))
    return DTYPE_SIZES[name]


def _buffer_view(obj):
    """Returns (address, nbytes, shape, strides in elements, elem size,
    keepalive) of a tensor-like or buffer-protocol object."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):  # torch.Tensor
        es = obj.element_size()
        shape = tuple(obj.shape)
        strides = tuple(obj.stride())
        n = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
        return obj.data_ptr(), n * es, shape, strides, es, obj
    ai = getattr(obj, "__array_interface__", None)  # numpy and friends
    if ai is not None:
        if ai["data"][1]:
            raise ValueError("register_layer: the array is read-only")
        es = int(ai["typestr"][2:])
        shape = tuple(ai["shape"])
        strides = ai.get("strides")
        strides = tuple(s // es for s in strides) if strides else None
        mv = memoryview(obj)
        return ai["data"][0], mv.nbytes, shape, strides, es, obj
    mv = memoryview(obj)
    if mv.readonly:
        raise ValueError("register_layer: the buffer is read-only (KV "
                         "memory is written by transfers)")
    if not mv.c_contiguous:
        raise ValueError("register_layer: the buffer is not contiguous")
    raw = mv.cast("B")
    addr = ctypes.addressof((ctypes.c_char * raw.nbytes).from_buffer(raw))
    es = mv.itemsize
    strides = tuple(s // es for s in mv.strides) if mv.ndim else None
    return addr, raw.nbytes, tuple(mv.shape), strides, es, (obj, raw)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


class Engine:
    """One kvxfer engine for one rank.

    ``Engine(config)`` takes the configuration as a dict (or a JSON string);
    use it as a context manager or call ``close()``. Every method raises a
    ``KvxError`` subclass naming the status and the library's message.
    Methods may be called from any thread; waits release the GIL.
    """

    def __init__(self, config, lib=None):
        self.api = _lib.load(lib)
        self._h = ctypes.c_void_p()
        self._keep = []          # objects whose memory is registered
        self._layers = {}        # name -> index (registration order)
        self._pending = collections.deque()  # events taken, not yet handed
        self._plock = threading.Lock()
        self._ev_count = 0       # events taken from the library so far
        self._aio = None
        st = self.api.engine_create(_json_arg(config), ctypes.byref(self._h))
        _check(self.api, st, "engine_create")

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Destroys the engine (blocks until its threads stopped). Memory of
        registered layers may be released after this returns."""
        if self._aio is not None:
            self._aio.close()
            self._aio = None
        if self._h:
            self.api.engine_destroy(self._h)
            self._h = ctypes.c_void_p()
        self._keep = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def handle(self):
        if not self._h:
            raise KvxError(-4, "KVX_ERR_BAD_STATE", "engine is closed")
        return self._h

    def _string_call(self, call, *args):
        out = ctypes.c_void_p()
        st = getattr(self.api, call)(*args, ctypes.byref(out))
        if st < 0:
            _lib.take_string(self.api, out)  # never set on error; be safe
            _check(self.api, st, call)
        return _lib.take_string(self.api, out)

    # -- configuration and reports -----------------------------------------
    def config(self):
        """The effective configuration (dict)."""
        return json.loads(self._string_call("config_dump", self.handle))

    def stats(self):
        return json.loads(self._string_call("stats", self.handle))

    def transports(self):
        return json.loads(self._string_call("transports", self.handle))

    def registration_payload(self):
        return json.loads(self._string_call("registration_payload",
                                            self.handle))

    # -- memory -------------------------------------------------------------
    def register_layer(self, name, tensor=None, *, ptr=None, shape=None,
                       strides=None, dtype=None, length=None, block_size,
                       num_kv_heads, head_size, head_size_v=0, key_only=False,
                       mem_type=None):
        """Registers one KV tensor (before start) and returns its index.

        Either ``tensor``: a torch tensor, a numpy array or any writable
        buffer-protocol object (shape, strides and dtype taken from it unless
        given), or ``ptr`` (int address) with ``shape``, ``strides``
        (elements, as torch reports them; default contiguous) and ``dtype``
        (a name such as "bfloat16", a torch/numpy dtype, or bytes per
        element). The memory must stay valid until close(); a tensor object
        is kept referenced until then. mem_type "host" or "rocm"; default:
        "rocm" for a torch tensor on a GPU (ROCm torch reports is_cuda),
        else "host".
        """
        if mem_type is None:
            mem_type = "rocm" if getattr(tensor, "is_cuda", False) else "host"
        if (tensor is None) == (ptr is None):
            raise ValueError("register_layer: give a tensor or ptr=, not both")
        if tensor is not None:
            addr, nbytes, tshape, tstrides, es, keep = _buffer_view(tensor)
        else:
            if shape is None or dtype is None:
                raise ValueError("register_layer: ptr= needs shape= and dtype=")
            addr, nbytes, tshape, tstrides, es, keep = \
                int(ptr), None, None, None, None, None
        shape = tuple(int(s) for s in (shape if shape is not None else tshape))
        es = _elem_size(dtype) if dtype is not None else es
        if strides is not None:
            strides = tuple(int(s) for s in strides)
        elif tstrides is not None and len(tstrides) == len(shape) and \
                tuple(tshape) == shape:
            strides = tuple(tstrides)
        else:
            strides = _contiguous_strides(shape)
        if len(shape) != len(strides) or not 1 <= len(shape) <= 8:
            raise ValueError("register_layer %s: shape %s / strides %s: need "
                             "1..8 dims each" % (name, shape, strides))
        span = (1 + sum((s - 1) * st for s, st in zip(shape, strides))) * es
        if length is None:
            length = span
        if nbytes is not None and length > nbytes:
            raise ValueError("register_layer %s: shape %s x %d bytes spans "
                             "%d bytes, the buffer has %d"
                             % (name, shape, es, length, nbytes))
        d = _lib.LayerDesc()
        d.struct_size = ctypes.sizeof(d)
        d.name = name.encode()
        d.base = addr
        d.length = length
        d.mem_type = MEM_TYPES[mem_type] if isinstance(mem_type, str) \
            else int(mem_type)
        d.ndim = len(shape)
        for i, (s, st) in enumerate(zip(shape, strides)):
            d.shape[i], d.stride[i] = s, st
        d.elem_size = es
        d.block_size = block_size
        d.num_kv_heads = num_kv_heads
        d.head_size = head_size
        d.head_size_v = head_size_v
        d.key_only = 1 if key_only else 0
        _check(self.api, self.api.register_layer(self.handle, ctypes.byref(d)),
               "register_layer " + name)
        self._keep.append(keep)
        self._layers[name] = len(self._layers)
        return self._layers[name]

    def layer_index(self, layer):
        """The index of a layer given by name (or an index, returned as is)."""
        if isinstance(layer, int):
            return layer
        try:
            return self._layers[layer]
        except KeyError:
            raise KvxError(-5, "KVX_ERR_NOT_FOUND", "layer '%s': not "
                           "registered on this engine" % layer) from None

    @property
    def layers(self):
        return list(self._layers)

    def alloc_region(self, length):
        """Host memory allocated through UCX (same-host peers then copy
        directly); returns a writable memoryview (valid until free_region or
        close). Register layers inside it with ptr= or the view."""
        p = ctypes.c_void_p()
        _check(self.api, self.api.alloc_region(self.handle, length,
                                               ctypes.byref(p)),
               "alloc_region")
        return memoryview((ctypes.c_char * length).from_address(p.value)) \
            .cast("B")

    def free_region(self, view):
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view)) \
            if isinstance(view, memoryview) else int(view)
        _check(self.api, self.api.free_region(self.handle, addr),
               "free_region")

    def start(self):
        _check(self.api, self.api.start(self.handle), "start")

    # -- requests -------------------------------------------------------------
    def producer_request(self, request_id, params, block_ids):
        """P: the KV of request_id is (READ) or will be (WRITE) in block_ids.
        Returns the kv_transfer_params P hands back to the proxy (dict)."""
        arr, n = _ids(block_ids)
        return json.loads(self._string_call(
            "producer_request", self.handle, request_id.encode(),
            _json_arg(params), arr, n))

    def consumer_request(self, request_id, params, block_ids):
        """D: receive the KV of request_id into block_ids; returns at once."""
        arr, n = _ids(block_ids)
        _check(self.api, self.api.consumer_request(
            self.handle, request_id.encode(), _json_arg(params), arr, n),
            "consumer_request")

    def consumer_abort(self, request_id, params):
        _check(self.api, self.api.consumer_abort(
            self.handle, request_id.encode(), _json_arg(params)),
            "consumer_abort")

    def layer_ready(self, transfer_id, layer):
        """P, WRITE: the KV of `layer` (index or name) is computed."""
        _check(self.api, self.api.layer_ready(
            self.handle, transfer_id.encode(), self.layer_index(layer)),
            "layer_ready")

    def seal_transfer(self, transfer_id):
        _check(self.api, self.api.seal_transfer(self.handle,
                                                transfer_id.encode()),
               "seal_transfer")

    def connect_peer(self, params, timeout_ms=0):
        _check(self.api, self.api.connect_peer(self.handle, _json_arg(params),
                                               int(timeout_ms)),
               "connect_peer")

    # -- waits ----------------------------------------------------------------
    def wait_layer(self, transfer_id, layer, timeout_ms=-1):
        """Blocks until the layer (index or name) landed; raises on failure
        or timeout. timeout_ms < 0: the transfer's own deadline."""
        _check(self.api, self.api.wait_layer(
            self.handle, transfer_id.encode(), self.layer_index(layer),
            int(timeout_ms)), "wait_layer")

    def wait_transfer(self, transfer_id, timeout_ms=-1):
        _check(self.api, self.api.wait_transfer(
            self.handle, transfer_id.encode(), int(timeout_ms)),
            "wait_transfer")

    def wait_events(self, timeout_ms):
        """True when an event is pending within timeout_ms, else False."""
        with self._plock:
            if self._pending:
                return True
        st = self.api.wait_events(self.handle, int(timeout_ms))
        if st == -27:  # KVX_ERR_TIMEOUT
            return False
        _check(self.api, st, "wait_events")
        return True

    def _take_events(self, max_events=64):
        """Moves the library's pending events into self._pending; the
        block_ids arrays are copied and freed one by one."""
        evs = (_lib.CEvent * max_events)()
        while True:
            n = _check(self.api, self.api.poll_events(self.handle, evs,
                                                      max_events),
                       "poll_events")
            got = []
            for e in evs[:n]:
                ids = e.block_ids[:e.num_block_ids] if e.block_ids else []
                if e.block_ids:
                    self.api.free(ctypes.cast(e.block_ids, ctypes.c_void_p))
                got.append(Event(EVENT_TYPES.get(e.type, str(e.type)),
                                 e.status,
                                 self.api.status_name(e.status).decode(),
                                 e.transfer_id.decode(), e.request_id.decode(),
                                 e.reason.decode(errors="replace"), ids))
            with self._plock:
                self._pending.extend(got)
                self._ev_count += len(got)
            if n < max_events:
                return

    def poll_events(self):
        """All pending events (list of Event), oldest first."""
        self._take_events()
        with self._plock:
            out = list(self._pending)
            self._pending.clear()
        return out

    def take_event(self, transfer_id):
        """The pending event of transfer_id, removed from the queue, or
        None."""
        self._take_events()
        with self._plock:
            for i, e in enumerate(self._pending):
                if e.transfer_id == transfer_id:
                    del self._pending[i]
                    return e
        return None

    def wait_event(self, transfer_id, timeout_ms, raise_failed=True):
        """Blocks until the event of transfer_id arrives (Event), raising
        TransferFailed for a FAILED one (if raise_failed) and KvxTimeout
        after timeout_ms."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            ev = self.take_event(transfer_id)
            if ev is not None:
                if raise_failed and not ev.ok:
                    raise TransferFailed(ev)
                return ev
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                raise error_class(-27)(
                    -27, "KVX_ERR_TIMEOUT", "no event for transfer %s "
                    "within %d ms" % (transfer_id, timeout_ms), "wait_event")
            # The library's queue is empty here (taken above): this sleeps
            # until a new event is queued or the deadline.
            st = self.api.wait_events(self.handle, left)
            if st != -27:
                _check(self.api, st, "wait_events")

    def event_fd(self):
        """The engine's pollable descriptor (ABI 1.3): readable while events
        are pending. Owned by the engine; do not read or close it."""
        fd = ctypes.c_int(-1)
        _check(self.api, self.api.event_fd(self.handle, ctypes.byref(fd)),
               "event_fd")
        return fd.value

    @property
    def aio(self):
        """asyncio helpers bound to this engine (see kvxfer.aio)."""
        if self._aio is None:
            from .aio import EngineAio
            self._aio = EngineAio(self)
        return self._aio
