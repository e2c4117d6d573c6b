"""Every op of the torch-shaped surface against PyTorch 1.13 on random inputs: values and
gradients (normalized error <= 1e-5 in float32), as methods and as tessera.<name> functions."""
import numpy as np
import pytest

import tessera
from conftest import assert_close

# Input kinds: f normal float32, p positive float32, i int64 in [lo, hi), b bool.
def f(*shape):
    return ("f", shape)


def p(*shape):
    return ("p", shape)


def i(lo, hi, *shape):
    return ("i", shape, lo, hi)


def b(*shape):
    return ("b", shape)


X, Y = f(3, 4, 5), f(4, 5)
CASES = [
    # elementwise, operators and promotion
    ("add", lambda m, x, y: x + y, [X, Y]),
    ("add_alpha", lambda m, x, y: x.add(y, alpha=0.5), [X, Y]),
    ("sub", lambda m, x, y: x - y, [X, Y]),
    ("mul", lambda m, x, y: x * y, [X, Y]),
    ("div", lambda m, x, y: x / y, [X, p(4, 5)]),
    ("radd", lambda m, x: 2 + x, [X]),
    ("rsub", lambda m, x: 2.5 - x, [X]),
    ("rmul", lambda m, x: 3 * x, [X]),
    ("rdiv", lambda m, x: 1.5 / x, [p(3, 4)]),
    ("pow_scalar", lambda m, x: x ** 2, [X]),
    ("pow_frac", lambda m, x: x ** 0.5, [p(3, 4)]),
    ("rpow", lambda m, x: 2 ** x, [X]),
    ("pow_tensor", lambda m, x, y: x.pow(y), [p(3, 4), f(3, 4)]),
    ("neg", lambda m, x: -x, [X]),
    ("abs", lambda m, x: abs(x), [X]),
    ("floordiv", lambda m, x, y: x.detach() // y.detach(), [X, p(4, 5)]),
    ("mod", lambda m, x, y: x % y, [X, p(4, 5)]),
    ("int_floordiv", lambda m, x: x // 3, [i(-9, 9, 4, 5)]),
    ("int_mod", lambda m, x: x % 3, [i(-9, 9, 4, 5)]),
    ("int_plus_float", lambda m, x: x + 0.5, [i(-5, 5, 4)]),
    ("int_times_2.0", lambda m, x: x * 2.0, [i(-5, 5, 4)]),
    ("int_true_div", lambda m, x: x / 2, [i(-5, 5, 4)]),
    ("int_plus_int", lambda m, x: x + 3, [i(-5, 5, 4)]),
    ("bool_plus_int", lambda m, x: x + 1, [b(4)]),
    ("int_plus_float_tensor", lambda m, x, y: x + y, [i(-5, 5, 4), f(4)]),
    ("f32_plus_f64_0d", lambda m, x: x + m.tensor(2.0, dtype=m.float64), [X]),
    ("f32_plus_f64", lambda m, x: x + x.double(), [X]),
    ("int_plus_0d_float", lambda m, x: x + m.tensor(1.5), [i(0, 5, 4)]),
    *[(n, (lambda n: lambda m, x: getattr(x, n)())(n), [X]) for n in
      ["exp", "tanh", "sigmoid", "relu", "sin", "cos", "neg", "abs", "square", "erf", "floor", "ceil",
       "round", "sign"]],
    ("silu", lambda m, x: x.silu() if m is tessera else m.nn.functional.silu(x), [X]),
    *[(n, (lambda n: lambda m, x: getattr(x, n)())(n), [p(3, 4)]) for n in ["log", "sqrt", "rsqrt", "reciprocal"]],
    *[("fn_" + n, (lambda n: lambda m, x: getattr(m, n)(x))(n), [X]) for n in
      ["exp", "tanh", "sigmoid", "relu", "abs", "neg", "sin", "cos"]],
    ("gelu", lambda m, x: x.gelu() if m is tessera else m.nn.functional.gelu(x), [X]),
    ("gelu_tanh", lambda m, x: x.gelu(approximate="tanh") if m is tessera else m.nn.functional.gelu(x, approximate="tanh"), [X]),
    ("clamp", lambda m, x: x.clamp(-0.5, 0.5), [X]),
    ("clamp_min_kw", lambda m, x: x.clamp(min=0.1), [X]),
    ("clamp_max_kw", lambda m, x: m.clamp(x, max=0.1), [X]),
    ("clip", lambda m, x: x.clip(-0.2, 0.3), [X]),
    ("clamp_tensor", lambda m, x, y: x.clamp(min=y), [X, Y]),
    ("maximum", lambda m, x, y: m.maximum(x, y), [X, Y]),
    ("minimum", lambda m, x, y: x.minimum(y), [X, Y]),
    ("lerp", lambda m, x, y: x.lerp(y, 0.3), [f(4, 5), Y]),
    # comparisons and logic
    *[(n, (lambda n: lambda m, x, y: getattr(x, n)(y))(n), [X, Y]) for n in ["eq", "ne", "lt", "le", "gt", "ge"]],
    ("lt_op", lambda m, x, y: x < y, [X, Y]),
    ("ge_scalar", lambda m, x: x >= 0.1, [X]),
    ("eq_int_scalar", lambda m, x: x == 2, [i(0, 4, 5, 6)]),
    ("and_or", lambda m, x, y: ((x > 0) & (y > 0)) | ~(x > 1), [X, Y]),
    ("xor", lambda m, x, y: (x > 0) ^ (y > 0), [X, Y]),
    ("logical_and", lambda m, x, y: m.logical_and(x > 0, y < 0), [X, Y]),
    ("where", lambda m, x, y: m.where(x > 0, x, y), [X, Y]),
    ("where_scalar", lambda m, x: m.where(x > 0, x, 0.0), [X]),
    ("where_method", lambda m, x, y: x.where(x > 0, y), [X, Y]),
    ("masked_fill", lambda m, x: x.masked_fill(x > 0.5, -1e9), [X]),
    ("masked_fill_fn", lambda m, x, y: m.masked_fill(x, y > 0, 0.0), [X, Y]),
    ("masked_fill_inf", lambda m, x: x.masked_fill(m.ones(5, 5).tril() == 0, float("-inf")).softmax(-1), [f(2, 5, 5)]),
    # reductions
    ("sum", lambda m, x: x.sum(), [X]),
    ("sum_dim", lambda m, x: x.sum(dim=1), [X]),
    ("sum_dims_keep", lambda m, x: x.sum(dim=(0, 2), keepdim=True), [X]),
    ("sum_neg", lambda m, x: m.sum(x, -1), [X]),
    ("sum_int", lambda m, x: x.sum(), [i(0, 9, 3, 4)]),
    ("sum_bool", lambda m, x: (x > 0).sum(), [X]),
    ("sum_dtype", lambda m, x: x.sum(dim=0, dtype=m.float64), [X]),
    ("mean", lambda m, x: x.mean(), [X]),
    ("mean_dim", lambda m, x: x.mean(-1, keepdim=True), [X]),
    ("mean_dims", lambda m, x: m.mean(x, dim=(1, 2)), [X]),
    ("max_all", lambda m, x: x.max(), [X]),
    ("max_dim", lambda m, x: tuple(x.max(dim=1)), [X]),
    ("max_dim_keep", lambda m, x: x.max(-1, keepdim=True).values, [X]),
    ("max_dim_indices", lambda m, x: x.max(1).indices, [X]),
    ("min_dim", lambda m, x: tuple(x.min(0)), [X]),
    ("min_all", lambda m, x: m.min(x), [X]),
    ("max_binary", lambda m, x, y: m.max(x, y), [X, Y]),
    ("amax", lambda m, x: x.amax(dim=(0, 1)), [X]),
    ("amin", lambda m, x: m.amin(x, -1, keepdim=True), [X]),
    ("argmax", lambda m, x: x.argmax(), [X]),
    ("argmax_dim", lambda m, x: x.argmax(dim=-1), [X]),
    ("argmin_dim", lambda m, x: m.argmin(x, dim=1, keepdim=True), [X]),
    ("var", lambda m, x: x.var(), [X]),
    ("var_dim", lambda m, x: x.var(dim=1, unbiased=False), [X]),
    ("std_dim", lambda m, x: x.std(-1, keepdim=True), [X]),
    ("logsumexp", lambda m, x: x.logsumexp(dim=-1), [X]),
    ("all", lambda m, x: (x > -10).all(), [X]),
    ("any_dim", lambda m, x: (x > 1).any(dim=1), [X]),
    ("softmax", lambda m, x: x.softmax(dim=-1), [X]),
    ("softmax_fn", lambda m, x: m.softmax(x, 1), [X]),
    ("log_softmax", lambda m, x: x.log_softmax(-1), [X]),
    ("log_softmax_fn", lambda m, x: m.log_softmax(x, dim=0), [X]),
    ("cumsum", lambda m, x: x.cumsum(dim=1), [X]),
    ("cumsum_fn_neg", lambda m, x: m.cumsum(x, -1), [X]),
    ("cumsum_int", lambda m, x: x.cumsum(0), [i(-5, 5, 6)]),
    ("topk", lambda m, x: tuple(x.topk(3)), [X]),
    ("topk_dim_smallest", lambda m, x: tuple(m.topk(x, 2, dim=1, largest=False)), [X]),
    ("topk_values", lambda m, x: m.topk(x, 2).values, [X]),
    # movement
    ("reshape", lambda m, x: x.reshape(4, 15), [X]),
    ("reshape_tuple", lambda m, x: x.reshape((-1, 5)), [X]),
    ("view", lambda m, x: x.view(3, -1), [X]),
    ("view_as", lambda m, x, y: x.view_as(y), [f(20), Y]),
    ("permute", lambda m, x: x.permute(2, 0, 1), [X]),
    ("permute_tuple", lambda m, x: m.permute(x, (1, 2, 0)), [X]),
    ("transpose", lambda m, x: x.transpose(1, 2), [X]),
    ("transpose_fn", lambda m, x: m.transpose(x, 0, -1), [X]),
    ("T", lambda m, x: x.T, [f(4, 5)]),
    ("t", lambda m, x: x.t(), [f(4, 5)]),
    ("mT", lambda m, x: x.mT, [X]),
    ("contiguous", lambda m, x: x.transpose(0, 1).contiguous(), [X]),
    ("flatten", lambda m, x: x.flatten(), [X]),
    ("flatten_from", lambda m, x: x.flatten(1), [X]),
    ("flatten_fn", lambda m, x: m.flatten(x, 0, 1), [X]),
    ("unsqueeze", lambda m, x: x.unsqueeze(1), [X]),
    ("unsqueeze_fn", lambda m, x: m.unsqueeze(x, -1), [X]),
    ("squeeze", lambda m, x: x.squeeze(), [f(3, 1, 4, 1)]),
    ("squeeze_dim", lambda m, x: x.squeeze(1), [f(3, 1, 4, 1)]),
    ("expand", lambda m, x: x.expand(3, 4, 5), [f(4, 1)]),
    ("expand_neg", lambda m, x: x.expand(2, -1, -1), [f(4, 5)]),
    ("expand_as", lambda m, x, y: x.expand_as(y), [f(1, 5), Y]),
    ("repeat", lambda m, x: x.repeat(2, 1, 3), [f(4, 5)]),
    ("split", lambda m, x: x.split(2, dim=1), [X]),
    ("split_sizes", lambda m, x: m.split(x, [1, 3], dim=1), [X]),
    ("chunk", lambda m, x: x.chunk(3, dim=-1), [f(3, 4, 6)]),
    ("chunk_fn", lambda m, x: m.chunk(x, 2), [f(4, 5)]),
    ("unbind", lambda m, x: x.unbind(1), [X]),
    ("narrow", lambda m, x: x.narrow(2, 1, 3), [X]),
    ("cat", lambda m, x, y: m.cat([x, y.unsqueeze(0)], dim=0), [X, Y]),
    ("cat_dim", lambda m, x: m.cat((x, x * 2), -1), [X]),
    ("stack", lambda m, x, y: m.stack([x, y], dim=1), [Y, Y]),
    ("flip", lambda m, x: x.flip(0, 2), [X]),
    ("tril", lambda m, x: x.tril(), [f(5, 5)]),
    ("triu_k", lambda m, x: m.triu(x, 1), [f(2, 5, 5)]),
    ("tril_neg", lambda m, x: m.tril(x, diagonal=-1), [f(4, 6)]),
    ("gather", lambda m, x, idx: x.gather(1, idx), [f(4, 5), i(0, 5, 4, 3)]),
    ("index_select", lambda m, x, idx: x.index_select(1, idx), [X, i(0, 4, 6)]),
    ("scatter_add", lambda m, x, idx, s: x.scatter_add(1, idx, s), [f(4, 5), i(0, 5, 4, 3), f(4, 3)]),
    # products
    ("matmul", lambda m, x, y: x @ y, [f(3, 4), f(4, 5)]),
    ("matmul_batched", lambda m, x, y: m.matmul(x, y), [f(2, 3, 4), f(4, 5)]),
    ("matmul_vec", lambda m, x, y: x @ y, [f(3, 4), f(4)]),
    ("mm", lambda m, x, y: x.mm(y), [f(3, 4), f(4, 5)]),
    ("bmm", lambda m, x, y: m.bmm(x, y), [f(2, 3, 4), f(2, 4, 5)]),
    ("einsum_mm", lambda m, x, y: m.einsum("ij,jk->ik", x, y), [f(3, 4), f(4, 5)]),
    ("einsum_bmm_t", lambda m, x, y: m.einsum("bij,bkj->bki", x, y), [f(2, 3, 4), f(2, 5, 4)]),
    ("einsum_outer", lambda m, x, y: m.einsum("i,j->ij", x, y), [f(3), f(4)]),
    ("einsum_implicit", lambda m, x, y: m.einsum("ij,jk", x, y), [f(3, 4), f(4, 5)]),
    ("einsum_sum_transpose", lambda m, x: m.einsum("ijk->ki", x), [X]),
    ("einsum_attention", lambda m, q, k: m.einsum("bhqd,bhkd->bhqk", q, k), [f(2, 2, 3, 4), f(2, 2, 5, 4)]),
    ("einsum_three", lambda m, x, y, z: m.einsum("ij,jk,kl->il", x, y, z), [f(2, 3), f(3, 4), f(4, 5)]),
    ("einsum_dot", lambda m, x, y: m.einsum("i,i->", x, y), [f(5), f(5)]),
    # conversions
    ("float", lambda m, x: x.float(), [i(0, 9, 4)]),
    ("long", lambda m, x: (x * 3).long(), [X]),
    ("int", lambda m, x: x.int(), [i(-9, 9, 4)]),
    ("double", lambda m, x: x.double() * 2, [X]),
    ("bool", lambda m, x: x.bool(), [i(0, 2, 4)]),
    ("half_roundtrip", lambda m, x: x.half().float(), [X]),
    ("bf16_roundtrip", lambda m, x: x.bfloat16().float(), [X]),
    ("to_dtype", lambda m, x: x.to(m.float64), [X]),
    ("to_dtype_kw", lambda m, x: x.to(dtype=m.long), [X]),
    ("to_device_dtype", lambda m, x: x.to("cpu", m.float64), [X]),
    ("to_tensor", lambda m, x, y: x.to(y), [i(0, 9, 4), f(3)]),
    ("type_as", lambda m, x, y: x.type_as(y), [i(0, 9, 4), f(3)]),
    ("clone", lambda m, x: x.clone() * 2, [X]),
    ("detach", lambda m, x: x.detach() * x, [X]),
    # indexing
    ("index_int", lambda m, x: x[1], [X]),
    ("index_last", lambda m, x: x[:, -1, :], [X]),
    ("index_ellipsis_none", lambda m, x: x[..., None], [X]),
    ("index_slices", lambda m, x: x[1:, ::2, 1:4], [X]),
    ("index_neg_slice", lambda m, x: x[:, -2:], [X]),
    ("index_list", lambda m, x: x[:, [-1], :], [X]),
    ("index_list2", lambda m, x: x[[0, 2]], [X]),
    ("index_tensor", lambda m, x, idx: x[idx], [f(6, 3), i(0, 6, 4)]),
    ("index_tensor_2d", lambda m, x, idx: x[idx], [f(6, 3), i(0, 6, 2, 4)]),
    ("index_tensor_dim1", lambda m, x, idx: x[:, idx], [X, i(0, 4, 5)]),
    ("index_mask", lambda m, x: x[x > 0], [f(5, 4)]),
    ("index_mask_rows", lambda m, x, y: x[y > 0], [f(6, 3), f(6)]),
    ("index_none_middle", lambda m, x: x[:, None, 1], [X]),
]


def make(spec, rng):
    kind, shape = spec[0], spec[1]
    if kind == "f":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "p":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "i":
        return rng.integers(spec[2], spec[3], shape).astype(np.int64)
    return rng.random(shape) > 0.5


def flat_outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torch(th, rng, name, fn, specs):
    arrays = [make(s, rng) for s in specs]
    grads = [a.dtype == np.float32 for a in arrays]
    tt = [tessera.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    pt = [th.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    t_out, p_out = fn(tessera, *tt), fn(th, *pt)
    assert_close(t_out, p_out, what=name)
    # Gradients: a random cotangent on every floating output that carries history.
    t_loss, p_loss = 0, 0
    for to, po in zip(flat_outputs(t_out), flat_outputs(p_out)):
        if po.requires_grad:
            w = rng.standard_normal(tuple(po.shape)).astype(np.float32 if po.dtype == th.float32 else np.float64)
            t_loss = t_loss + (to * tessera.tensor(w)).sum()
            p_loss = p_loss + (po * th.tensor(w)).sum()
    if not isinstance(p_loss, int):
        t_loss.backward()
        p_loss.backward()
        for k, (a, b) in enumerate(zip(tt, pt)):
            if b.grad is not None:
                assert a.grad is not None, f"{name}: no gradient reached input {k}"
                assert_close(a.grad, b.grad, what=f"{name} grad of input {k}")
            elif a.grad is not None:  # torch: unused; tessera may hold zeros
                assert float(abs(a.grad).max()) == 0, f"{name}: gradient for an unused input {k}"
