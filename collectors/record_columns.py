"""The profiler's event tree as flat preorder columns, read through torch's pybind wrappers: the
same columns, in the same layout, as the native reader's `event_tree` (collectors/native/
record_native.cpp), so that the recorder folds one representation whichever reader ran. This is
the fallback where the native reader cannot be built; it pays a pybind call per attribute."""

from __future__ import annotations

from typing import Any

from dlpt.collectors.record_native import K_CALL, K_CCALL, K_KINETO, K_OP, K_OTHER


class _Interner:
    __slots__ = ("index", "values")

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.values: list[Any] = []

    def add(self, v: Any) -> int:
        i = self.index.get(v)
        if i is None:
            i = self.index[v] = len(self.values)
            self.values.append(v)
        return i


def _text(obj: Any, attr: str) -> str | None:
    """A name torch may have read from freed memory: None when it is not valid UTF-8 (the native
    reader gives None too)."""
    try:
        return getattr(obj, attr)
    except UnicodeDecodeError:
        return None


def event_tree(kr: Any) -> dict[str, Any]:
    """Columns of `kr.experimental_event_tree()` in preorder; `end[i]` is one past node i's
    subtree. A runtime call directly under an op is read without its children: they are only its
    own device events, which come from the device-event reader, and the fold never visits them."""
    from torch._C import _profiler as P

    kind_of = {P._ExtraFields_TorchOp: K_OP, P._ExtraFields_PyCall: K_CALL,
               P._ExtraFields_PyCCall: K_CCALL, P._ExtraFields_Kineto: K_KINETO}
    cols = {k: [] for k in ("kind", "end", "start", "stop", "tid", "corr", "name", "seq", "module",
                            "caller_file", "caller_line", "caller_func", "site_file", "site_line", "site_func")}
    kind, end, start, stop, tid, corr = (cols[k] for k in ("kind", "end", "start", "stop", "tid", "corr"))
    name, seq, module = cols["name"], cols["seq"], cols["module"]
    cfile, cline, cfunc = cols["caller_file"], cols["caller_line"], cols["caller_func"]
    sfile, sline, sfunc = cols["site_file"], cols["site_line"], cols["site_func"]
    names, strs = _Interner(), _Interner()
    roots: list[int] = []
    for root in kr.experimental_event_tree():
        roots.append(len(kind))
        open_: list[int] = []
        todo: list[tuple[Any, int, int]] = [(root, -1, K_OTHER)]
        while todo:
            n, parent, parent_kind = todo.pop()
            i = len(kind)
            ef = n.extra_fields
            k = kind_of.get(type(ef), K_OTHER)
            nm, sq, mod, cf, cl, cfn, sf, sl, sfn = -1, -1, 0, -1, 0, -1, -1, 0, -1
            if k == K_OP:
                nm = names.add(_text(n, "name"))
                sq = ef.sequence_number
            elif k == K_CALL:
                c, s = ef.caller, ef.callsite
                cf, cl, cfn = strs.add(_text(c, "file_name")), c.line_number, strs.add(_text(c, "function_name"))
                sf, sl, sfn = strs.add(_text(s, "file_name")), s.line_number, strs.add(_text(s, "function_name"))
                if ef.module is not None:
                    mod = 1
                    nm = names.add(_text(n, "name"))
            elif k == K_CCALL:
                c = ef.caller
                cf, cl, cfn = strs.add(_text(c, "file_name")), c.line_number, strs.add(_text(c, "function_name"))
            kind.append(k)
            end.append(0)
            start.append(n.start_time_ns)
            stop.append(n.end_time_ns)
            tid.append(n.start_tid)
            corr.append(n.correlation_id)
            name.append(nm)
            seq.append(sq)
            module.append(mod)
            cfile.append(cf)
            cline.append(cl)
            cfunc.append(cfn)
            sfile.append(sf)
            sline.append(sl)
            sfunc.append(sfn)
            while open_ and open_[-1] != parent:
                end[open_.pop()] = i
            open_.append(i)
            if k == K_KINETO and parent_kind == K_OP:
                continue
            for c in reversed(n.children):
                todo.append((c, i, k))
        for o in open_:
            end[o] = len(kind)
    cols["roots"] = roots
    cols["names"] = names.values
    cols["strs"] = strs.values
    return cols
