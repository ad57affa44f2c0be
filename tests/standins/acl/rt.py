"""Stand-in ``acl.rt``: devices, contexts (current one per thread), streams, memory, memcpy."""

from __future__ import annotations

import ctypes

from acl._core import (DEVICE_BASE, KIND_D2D, KIND_D2H, KIND_DEFAULT, KIND_H2D, KIND_H2H, Alloc, S, api, host_read,
                       host_write)


@api("acl.rt.get_device_count", "", ret="pair")
def get_device_count() -> tuple[int, int]:
    if not S.initialized:
        return 0, 100001
    return S.device_count, 0


@api("acl.rt.set_device", "i")
def set_device(device_id: int) -> int:
    if not S.initialized:
        return 100001
    if not 0 <= device_id < S.device_count:
        return 107001
    S.devices[device_id] = S.devices.get(device_id, 0) + 1
    if device_id not in S.default_ctx:
        ctx = S.new("ctx", 16)
        S.contexts[ctx] = device_id
        S.default_ctx[device_id] = ctx
    S.current_ctx = S.default_ctx[device_id]
    return 0


@api("acl.rt.reset_device", "i")
def reset_device(device_id: int) -> int:
    if not S.initialized:
        return 100001
    if device_id not in S.devices:
        S.violate(f"acl.rt.reset_device({device_id}) on a device that is not set")
        return 107001
    S.devices[device_id] -= 1
    if S.devices[device_id] == 0:  # set_device/reset_device are reference counted: the last reset frees
        own = [c for c, d in S.contexts.items() if d == device_id and c != S.default_ctx.get(device_id)]
        if own:
            S.violate(f"acl.rt.reset_device({device_id}) with context(s) {[hex(c) for c in own]} not destroyed")
        del S.devices[device_id]
        left = [hex(p) for p, a in S.mem.items() if a.device == device_id]
        if left:
            S.violate(f"acl.rt.reset_device({device_id}) with device memory {left} not freed")
        loaded = [m for m, rec in S.models.items() if rec.device == device_id]
        if loaded:
            S.violate(f"acl.rt.reset_device({device_id}) with model(s) {loaded} still loaded")
        ctx = S.default_ctx.pop(device_id)
        S.contexts.pop(ctx, None)
        S.destroyed.add(ctx)
        if S.current_ctx == ctx:
            S.current_ctx = None
    return 0


@api("acl.rt.create_context", "i", ret="pair")
def create_context(device_id: int) -> tuple[int, int]:
    if not S.initialized:
        return 0, 100001
    if device_id not in S.devices:
        S.violate(f"acl.rt.create_context({device_id}) before acl.rt.set_device({device_id})")
        return 0, 107001
    ctx = S.new("ctx", 16)
    S.contexts[ctx] = device_id
    S.current_ctx = ctx
    return ctx, 0


@api("acl.rt.destroy_context", "i")
def destroy_context(ctx: int) -> int:
    if not S.initialized:
        return 100001
    if ctx not in S.contexts or ctx in S.default_ctx.values():
        S.violate(f"acl.rt.destroy_context of unknown/destroyed/default context {hex(ctx)}")
        return 107000
    streams = [hex(s) for s, c in S.streams.items() if c == ctx]
    if streams:
        S.violate(f"acl.rt.destroy_context({hex(ctx)}) with stream(s) {streams} not destroyed")
    models = [m for m, rec in S.models.items() if rec.ctx == ctx]
    if models:
        S.violate(f"acl.rt.destroy_context({hex(ctx)}) with model(s) {models} still loaded")
    mem = [hex(p) for p, a in S.mem.items() if a.ctx == ctx]
    if mem:
        S.violate(f"acl.rt.destroy_context({hex(ctx)}) with device memory {mem} not freed")
    del S.contexts[ctx]
    S.destroyed.add(ctx)
    if S.current_ctx == ctx:  # this thread is left without a context; other threads naming ctx are not
        S.current_ctx = None
    return 0


@api("acl.rt.set_context", "i")
def set_context(ctx: int) -> int:
    if not S.initialized:
        return 100001
    if ctx not in S.contexts:
        S.violate(f"acl.rt.set_context of unknown/destroyed context {hex(ctx)}")
        return 107000
    S.current_ctx = ctx
    return 0


@api("acl.rt.get_context", "", ret="pair")
def get_context() -> tuple[int, int]:
    ctx = S.current_ctx
    if not S.initialized:
        return 0, 100001
    if ctx is None:
        return 0, 107002
    return ctx, 0   # possibly a destroyed context: the thread-local slot still holds it


@api("acl.rt.get_run_mode", "", ret="pair")
def get_run_mode() -> tuple[int, int]:
    if not S.initialized:
        return 0, 100001
    return S.run_mode, 0   # 1 ACL_HOST, 0 ACL_DEVICE


@api("acl.rt.create_stream", "", ret="pair")
def create_stream() -> tuple[int, int]:
    rc = S.need_ctx("acl.rt.create_stream")
    if rc:
        return 0, rc
    s = S.new("stream", 16)
    S.streams[s] = S.current_ctx
    return s, 0


@api("acl.rt.destroy_stream", "i")
def destroy_stream(stream: int) -> int:
    rc = S.need_ctx("acl.rt.destroy_stream")
    if rc:
        return rc
    if stream not in S.streams:
        S.violate(f"acl.rt.destroy_stream of unknown/destroyed stream {hex(stream)}")
        return 107000
    if S.streams[stream] != S.current_ctx:
        S.violate(f"acl.rt.destroy_stream({hex(stream)}) from another context")
        return 107003
    del S.streams[stream]
    return 0


@api("acl.rt.synchronize_stream", "i")
def synchronize_stream(stream: int) -> int:
    rc = S.need_ctx("acl.rt.synchronize_stream")
    if rc:
        return rc
    if stream not in S.streams:
        return 107000
    if S.streams[stream] != S.current_ctx:
        return 107003
    return 0


@api("acl.rt.malloc", "ii", ret="pair")
def malloc(size: int, policy: int) -> tuple[int, int]:
    rc = S.need_ctx("acl.rt.malloc")
    if rc:
        return 0, rc
    if size <= 0 or policy not in (0, 1, 2, 3, 4, 5, 0x100, 0x1000):
        return 0, 100000
    ptr = S.new("dev", ((size + 4095) // 4096 + 1) * 4096)
    S.mem[ptr] = Alloc(size, S.contexts[S.current_ctx], S.current_ctx, bytearray(size))
    return ptr, 0


@api("acl.rt.free", "i")
def free(ptr: int) -> int:
    rc = S.need_ctx("acl.rt.free")
    if rc:
        return rc
    if ptr not in S.mem:
        S.violate(f"acl.rt.free of unknown/already freed pointer {hex(ptr)}")
        return 107000
    del S.mem[ptr]
    return 0


@api("acl.rt.malloc_host", "i", ret="pair")
def malloc_host(size: int) -> tuple[int, int]:
    rc = S.need_ctx("acl.rt.malloc_host")
    if rc:
        return 0, rc
    if size <= 0:
        return 0, 100000
    buf = (ctypes.c_char * size)()
    ptr = ctypes.addressof(buf)
    S.host[ptr] = Alloc(size, None, S.current_ctx, buf)
    return ptr, 0


@api("acl.rt.free_host", "i")
def free_host(ptr: int) -> int:
    rc = S.need_ctx("acl.rt.free_host")
    if rc:
        return rc
    if ptr not in S.host:
        S.violate(f"acl.rt.free_host of unknown/already freed pointer {hex(ptr)}")
        return 107000
    del S.host[ptr]
    return 0


@api("acl.rt.get_mem_info", "i", ret="triple")
def get_mem_info(attr: int) -> tuple[int, int, int]:
    total = 8 << 30
    used = sum(a.size for a in S.mem.values())
    return total - used, total, 0


def _region(name: str, ptr: int, n: int, want_device: bool):
    """(alloc, offset) for a device range, ``"host"`` for a host pointer, or an error code."""
    r = S.device_region(ptr, n)
    if r is None:
        if want_device:
            S.violate(f"{name}: {hex(ptr)} is host memory but the memcpy kind says device")
            return 107000
        if ptr == 0:
            S.violate(f"{name}: NULL host pointer")
            return 100000
        return "host"
    if isinstance(r, str):
        S.violate(f"{name}: {r}")
        return 100000 if "overflow" in r else 107000
    if not want_device:
        S.violate(f"{name}: {hex(ptr)} is device memory but the memcpy kind says host")
        return 107000
    return r


def _copy(name: str, dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    rc = S.need_ctx(name)
    if rc:
        return rc
    if count < 0 or dest_max < 0:
        return 100000
    if count > dest_max:
        S.violate(f"{name}: count {count} > destMax {dest_max}")
        return 100000
    if kind == KIND_DEFAULT:
        kind = {(False, True): KIND_H2D, (True, False): KIND_D2H, (True, True): KIND_D2D,
                (False, False): KIND_H2H}[(src >= DEVICE_BASE, dst >= DEVICE_BASE)]
    if kind not in (KIND_H2H, KIND_H2D, KIND_D2H, KIND_D2D):
        return 100000
    if S.run_mode == 0 and kind in (KIND_H2D, KIND_D2H):
        S.violate(f"{name}: run mode is ACL_DEVICE (app memory is device memory): use DEVICE_TO_DEVICE")
        return 107000
    app_is_device = S.run_mode == 0 and kind == KIND_D2D

    def region(ptr: int, n: int, want_device: bool):
        if app_is_device and ptr < DEVICE_BASE and ptr:
            return "host"        # the app's own memory, on the device side in this run mode
        return _region(name, ptr, n, want_device)

    d = region(dst, dest_max, kind in (KIND_H2D, KIND_D2D))
    if isinstance(d, int):
        return d
    s = region(src, count, kind in (KIND_D2H, KIND_D2D))
    if isinstance(s, int):
        return s
    if s == "host":
        data = host_read(src, count)
    else:
        alloc, off = s
        data = bytes(alloc.data[off:off + count])
    if d == "host":
        host_write(dst, data)
    else:
        alloc, off = d
        if alloc.ctx is not None and S.contexts.get(alloc.ctx) != S.contexts[S.current_ctx]:
            S.violate(f"{name}: destination on another device than the current context")
            return 107003
        alloc.data[off:off + count] = data
    return 0


@api("acl.rt.memcpy", "iiiii")
def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    return _copy("acl.rt.memcpy", dst, dest_max, src, count, kind)


@api("acl.rt.memcpy_async", "iiiiii")
def memcpy_async(dst: int, dest_max: int, src: int, count: int, kind: int, stream: int) -> int:
    if stream not in S.streams:
        return 107000
    return _copy("acl.rt.memcpy_async", dst, dest_max, src, count, kind)


@api("acl.rt.memset", "iiii")
def memset(ptr: int, dest_max: int, value: int, count: int) -> int:
    rc = S.need_ctx("acl.rt.memset")
    if rc:
        return rc
    if count > dest_max:
        return 100000
    r = _region("acl.rt.memset", ptr, dest_max, True)
    if isinstance(r, int):
        return r
    alloc, off = r
    alloc.data[off:off + count] = bytes([value & 0xFF]) * count
    return 0

