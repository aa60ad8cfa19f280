"""Kernel checks, run as a script in a subprocess (``python _kernel_checks.py MODE``).

Triton decides interpreter-or-compiler when a ``@triton.jit`` function is decorated, so
the pytest process (which other tests share) must not import triton with
``TRITON_INTERPRET=1``; a fresh interpreter per mode keeps that decision local.

MODE ``interpret`` (run with TRITON_INTERPRET=1): kernels vs torch on CPU tensors, fp32
and bf16, edge rows, fp64 rejected. MODE ``compile`` (no interpreter): every SPILL_SPECS
entry compiles ahead of time for sm_90, and a CPU launch fails with a clear message.
Prints one JSON object ``{check: {"ok": bool, "detail": str}}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

import torch

RESULTS: dict[str, dict[str, object]] = {}


def check(fn: Callable[[], str]) -> Callable[[], str]:
    try:
        RESULTS[fn.__name__] = {"ok": True, "detail": fn()}
    except Exception:
        RESULTS[fn.__name__] = {"ok": False, "detail": traceback.format_exc(limit=8)}
    return fn


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _err(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"max_abs={float((a.double() - b.double()).abs().max()):.2e}"


def interpret() -> None:
    from cpmatrix.suite.kernels.layernorm import BWD_ROWS, layer_norm
    from cpmatrix.suite.kernels.softmax import merge_partials_kernel, softmax, softmax_with_lse
    from cpmatrix.suite.ops.ring_attention import merge_partials

    @check
    def softmax_fp32_fwd_bwd() -> str:
        out = []
        for shape in ((7, 37), (3, 2, 16), (4, 1), (5, 300)):
            x = torch.randn(*shape, generator=_g())
            xk, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
            dy = torch.randn(*shape, generator=_g())
            yk, yr = softmax(xk), torch.softmax(xr, -1)
            yk.backward(dy)
            yr.backward(dy)
            torch.testing.assert_close(yk, yr)
            torch.testing.assert_close(xk.grad, xr.grad)
            out.append(f"{shape}: y {_err(yk, yr)} dx {_err(xk.grad, xr.grad)}")
        return "; ".join(out)

    @check
    def softmax_lse_masked_rows() -> str:
        x = torch.randn(6, 21, generator=_g())
        x[1] = float("-inf")            # every key masked
        x[2, ::2] = float("-inf")       # some keys masked
        y, lse = softmax_with_lse(x)
        assert bool((y[1] == 0).all()) and lse[1].item() == float("-inf")
        ok = [0, 2, 3, 4, 5]
        torch.testing.assert_close(y[ok], torch.softmax(x[ok], -1))
        torch.testing.assert_close(lse[ok], torch.logsumexp(x[ok], -1))
        return f"lse {_err(lse[ok], torch.logsumexp(x[ok], -1))}"

    @check
    def softmax_bf16() -> str:
        x = torch.randn(9, 50, generator=_g()).bfloat16()
        y = softmax(x)
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y, torch.softmax(x.float(), -1).bfloat16())
        return _err(y, torch.softmax(x.float(), -1))

    @check
    def merge_matches_reference() -> str:
        g = _g()
        o1, o2 = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
        l1, l2 = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
        l1[0, 0] = float("-inf")                      # first partial empty
        l1[0, 1] = l2[0, 1] = float("-inf")           # both empty
        ok, lk = merge_partials_kernel(o1, l1, o2, l2)
        orf, lrf = merge_partials(o1, l1, o2, l2)
        torch.testing.assert_close(ok, orf)
        torch.testing.assert_close(lk, lrf)
        assert lk[0, 1].item() == float("-inf") and bool((ok[0, 1] == 0).all())
        return f"out {_err(ok, orf)}"

    @check
    def merge_equals_joint_softmax() -> str:
        g = _g()
        s, v = torch.randn(4, 10, generator=g), torch.randn(10, 3, generator=g)
        p1, l1 = softmax_with_lse(s[:, :6].contiguous())
        p2, l2 = softmax_with_lse(s[:, 6:].contiguous())
        o, lse = merge_partials_kernel(p1 @ v[:6], l1, p2 @ v[6:], l2)
        torch.testing.assert_close(o, torch.softmax(s, -1) @ v)
        torch.testing.assert_close(lse, torch.logsumexp(s, -1))
        return _err(o, torch.softmax(s, -1) @ v)

    @check
    def layer_norm_fp32_fwd_bwd() -> str:
        out = []
        for rows, n in ((1, 8), (BWD_ROWS + 3, 24), (2 * BWD_ROWS, 33), (5, 200)):
            g = _g()
            x = torch.randn(rows, n, generator=g) * 3 + 1
            w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
            dy = torch.randn(rows, n, generator=g)
            ins_k = [t.clone().requires_grad_() for t in (x, w, b)]
            ins_r = [t.clone().requires_grad_() for t in (x, w, b)]
            yk = layer_norm(*ins_k, eps=1e-5)
            yr = torch.nn.functional.layer_norm(ins_r[0], (n,), ins_r[1], ins_r[2], 1e-5)
            gk = torch.autograd.grad(yk, ins_k, dy)
            gr = torch.autograd.grad(yr, ins_r, dy)
            torch.testing.assert_close(yk, yr)
            for a, c in zip(gk, gr, strict=True):
                torch.testing.assert_close(a, c)
            out.append(f"{rows}x{n}: y {_err(yk, yr)} dx {_err(gk[0], gr[0])} "
                       f"dw {_err(gk[1], gr[1])}")
        return "; ".join(out)

    @check
    def layer_norm_bf16() -> str:
        g = _g()
        x = torch.randn(6, 40, generator=g).bfloat16()
        w, b = torch.randn(40, generator=g), torch.randn(40, generator=g)  # fp32 params
        y = layer_norm(x, w, b)
        ref = torch.nn.functional.layer_norm(x.float(), (40,), w, b).bfloat16()
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y, ref)
        return _err(y, ref)

    @check
    def fp64_is_rejected() -> str:
        x = torch.randn(3, 4, dtype=torch.float64)
        msgs = []
        for call in (lambda: softmax(x), lambda: softmax_with_lse(x),
                     lambda: layer_norm(x, x[0], x[0]),
                     lambda: merge_partials_kernel(x, x[:, 0], x, x[:, 0])):
            try:
                call()
            except TypeError as e:
                msgs.append(str(e).split(";")[0])
                continue
            raise AssertionError("fp64 was accepted")
        return msgs[0]


def compile_specs() -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    @check
    def spill_specs_compile_for_sm90() -> str:
        done = []
        for mod_name in ("cpmatrix.suite.kernels.softmax", "cpmatrix.suite.kernels.layernorm"):
            mod = importlib.import_module(mod_name)
            for attr, spec in mod.SPILL_SPECS.items():
                src = triton.compiler.ASTSource(fn=getattr(mod, attr), signature=spec["signature"],
                                                constexprs=spec["constexprs"])
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=spec["options"])
                assert ".entry" in k.asm["ptx"], f"{attr}: no PTX entry"
                done.append(attr)
        return ", ".join(done)

    @check
    def cpu_launch_without_interpreter_is_explained() -> str:
        from cpmatrix.suite.kernels.softmax import softmax

        try:
            softmax(torch.randn(2, 3))
        except RuntimeError as e:
            assert "TRITON_INTERPRET=1" in str(e), str(e)
            return str(e)
        raise AssertionError("a CPU launch without the interpreter did not raise")


if __name__ == "__main__":
    {"interpret": interpret, "compile": compile_specs}[sys.argv[1]]()
    print(json.dumps(RESULTS))
